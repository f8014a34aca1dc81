//! The PostgreSQL store's `LISTEN` task: one per store, started by the first wait, waking this
//! process's waiters on the keys other connections announce (see the module docs' Waiting).

use std::{
    sync::{Arc, PoisonError},
    time::Duration,
};

use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::{sync::watch, time::Instant};

use super::{Inner, CHANNEL};
use crate::{key::KeyHash, store::sql::Waiters};

/// How long after a failed start the listener is tried again; waiting sleeps meanwhile.
const LISTENER_RETRY: Duration = Duration::from_secs(5);

/// The notification listener of one store: a task that connects, `LISTEN`s and then wakes the
/// waiters of each key it hears about.
#[derive(Default)]
pub(super) struct ListenerState {
    task: Option<tokio::task::JoinHandle<()>>,
    started_at: Option<Instant>,
}

impl Inner {
    /// Make sure the listener task runs, starting it in the background if needed; whether it
    /// listens.
    ///
    /// The caller never waits for the connection beyond its own deadline: a wait that begins
    /// before the listener is listening is bounded by its timeout like any other. A task that
    /// stopped (connection refused, pool closed) is restarted at most once per
    /// [`LISTENER_RETRY`]; meanwhile waits simply last their timeout.
    fn ensure_listener(&self) -> watch::Receiver<bool> {
        let mut state = self.listener.lock().unwrap_or_else(PoisonError::into_inner);
        let running = state.task.as_ref().is_some_and(|task| {
            !task.is_finished()
                || state
                    .started_at
                    .is_some_and(|at| at.elapsed() < LISTENER_RETRY)
        });
        if !running {
            state.task = Some(tokio::spawn(listen(
                self.pool.clone(),
                self.waiters.clone(),
                self.listening.clone(),
            )));
            state.started_at = Some(Instant::now());
        }
        self.listening.subscribe()
    }

    /// What a wait on `key` does before it waits for the notification (see
    /// [`sql::wait_for_change`](crate::store::sql::wait_for_change)): the listener listening, then the record marked watched.
    /// Whether to wait on: `false` once the record is no longer running or the deadline passed.
    pub(super) async fn watch(&self, key: &KeyHash, deadline: Instant) -> bool {
        let mut listening = self.ensure_listener();
        // Mark the record only once the listener listens: a completion committed after the mark
        // then reaches this process. Until then (or if it cannot listen) the wait is the timeout.
        if !matches!(
            tokio::time::timeout_at(deadline, listening.wait_for(|on| *on)).await,
            Ok(Ok(_))
        ) {
            tokio::time::sleep_until(deadline).await;
            return false;
        }
        let watch = sqlx::query_scalar::<_, bool>(self.queries.watch.clone())
            .bind(key.as_bytes().as_slice())
            .fetch_one(&self.pool);
        match tokio::time::timeout_at(deadline, watch).await {
            // No longer running: it changed between the claim and the mark.
            Ok(Ok(false)) | Err(_) => false,
            Ok(Ok(true)) => true,
            Ok(Err(err)) => {
                tracing::debug!(
                    target: "tower_idempotency",
                    error = %err,
                    "marking a record watched failed; waiting for the timeout"
                );
                true
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let state = self
            .listener
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(task) = &state.task {
            task.abort();
        }
    }
}

/// Connect and listen, then receive notifications until the listener fails; `listening` is
/// `true` meanwhile.
async fn listen(pool: PgPool, waiters: Arc<Waiters>, listening: Arc<watch::Sender<bool>>) {
    // A connection of its own, outside the application's pool: a listener holds its connection
    // for good, which would starve a small pool.
    let started = async {
        let own = PgPoolOptions::new()
            .max_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(pool.connect_options().as_ref().clone())
            .await?;
        let mut listener = PgListener::connect_with(&own).await?;
        listener.listen(CHANNEL).await?;
        Ok::<_, sqlx::Error>(listener)
    };
    let mut listener = match started.await {
        Ok(listener) => listener,
        Err(err) => {
            tracing::warn!(
                target: "tower_idempotency",
                error = %err,
                "cannot listen for idempotency notifications; waiting falls back to polling"
            );
            return;
        }
    };
    listening.send_replace(true);
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => {
                if let Some(key) = KeyHash::from_hex(notification.payload()) {
                    waiters.wake(&key);
                }
            }
            // The connection was lost and re-established: notifications may have been missed.
            Ok(None) => waiters.wake_all(),
            Err(err) => {
                tracing::warn!(
                    target: "tower_idempotency",
                    error = %err,
                    "the idempotency notification listener stopped; a later wait restarts it"
                );
                listening.send_replace(false);
                waiters.wake_all();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notification_payloads_parse_as_key_hashes() {
        let key = KeyHash([0xab; 32]);
        assert_eq!(KeyHash::from_hex(&key.to_hex()), Some(key));
        assert_eq!(KeyHash::from_hex(&"AB".repeat(32)), Some(key));
        assert_eq!(KeyHash::from_hex("abc"), None);
        assert_eq!(KeyHash::from_hex(&"zz".repeat(32)), None);
        assert_eq!(KeyHash::from_hex(&"é".repeat(32)), None);
    }
}
