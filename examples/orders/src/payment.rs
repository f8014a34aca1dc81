//! A stand-in for a payment provider.

use std::time::Duration;

use tower_idempotency::IdempotencyKey;

/// A simulated payment provider that takes `latency` to answer.
///
/// Real providers (Stripe, Adyen) accept an idempotency key of their own: the handler passes the
/// client's key onward, so a retry that reaches the provider again is not charged twice there
/// either. This one never fails.
#[derive(Debug, Clone, Copy)]
pub struct PaymentProvider {
    latency: Duration,
}

impl PaymentProvider {
    /// A provider that answers after `latency`.
    pub fn new(latency: Duration) -> Self {
        Self { latency }
    }

    /// Authorise `amount_cents` for `customer_id`, forwarding `key` as the provider's own
    /// idempotency key.
    pub async fn authorize(&self, _key: &IdempotencyKey, customer_id: &str, amount_cents: i64) {
        // A real provider's request carries the key; this stand-in only waits. The key is not
        // logged: keys often carry meaning (an order or payment id).
        tracing::debug!(customer_id, amount_cents, "authorising payment");
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
    }
}
