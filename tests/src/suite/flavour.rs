//! The modes the behaviour suite runs in ([`Flavour`]), and what each mode's contract expects
//! where the modes differ by design ([`Contract`]).
//!
//! Every behaviour builds its layer through its flavour (`F::layer(store)`, never
//! `Idempotency::new(store)`), so one body runs in every mode. Where a mode's documented
//! contract differs, the body asks [`Contract`] what to expect; no behaviour is skipped in any
//! mode.

use std::{ops::RangeInclusive, sync::Arc, time::Duration};

use http::StatusCode;
use tower_idempotency::{
    store::{postgres::PostgresStore, Store, TransactionalStore},
    Idempotency, Mode,
};

use super::Reply;

/// A mode the behaviour suite runs in: how a behaviour builds its layer, and the mode's
/// contract where it differs from the others.
pub trait Flavour<St: Store>: 'static {
    /// The layer's mode.
    type Mode: Mode<St>;

    /// What this mode does where the modes differ.
    const CONTRACT: Contract;

    /// A layer in this mode, with the defaults, over a store the test also uses directly.
    fn from_shared(store: Arc<St>) -> Idempotency<St, Self::Mode>;

    /// A layer in this mode, with the defaults, over `store`.
    fn layer(store: St) -> Idempotency<St, Self::Mode> {
        Self::from_shared(Arc::new(store))
    }
}

/// The default mode (`Idempotency::new(store)`), on every store.
#[derive(Debug, Clone, Copy)]
pub struct Standard;

impl<St: Store> Flavour<St> for Standard {
    type Mode = tower_idempotency::Standard;
    const CONTRACT: Contract = Contract::LEASED;

    fn from_shared(store: Arc<St>) -> Idempotency<St, Self::Mode> {
        Idempotency::from_shared(store)
    }
}

/// Transactional mode (`Idempotency::new(store).transactional()`), on the SQL stores. The
/// suite's handlers never begin the transaction; the claim, the lease and what a duplicate sees
/// are those of the default mode.
#[derive(Debug, Clone, Copy)]
pub struct Transactional;

impl<St: TransactionalStore> Flavour<St> for Transactional {
    type Mode = tower_idempotency::Transactional;
    const CONTRACT: Contract = Contract::LEASED;

    fn from_shared(store: Arc<St>) -> Idempotency<St, Self::Mode> {
        Idempotency::from_shared(store).transactional()
    }
}

/// Single-commit mode (`Idempotency::new(store).transactional_single_commit()`), PostgreSQL
/// only: the claim is made inside the handler's transaction under an advisory lock and commits
/// with the answer (see `tower_idempotency::single_commit`).
#[derive(Debug, Clone, Copy)]
pub struct SingleCommit;

impl Flavour<PostgresStore> for SingleCommit {
    type Mode = tower_idempotency::SingleCommit;
    const CONTRACT: Contract = Contract::SINGLE_COMMIT;

    fn from_shared(store: Arc<PostgresStore>) -> Idempotency<PostgresStore, Self::Mode> {
        Idempotency::from_shared(store).transactional_single_commit()
    }
}

/// What a mode does where the modes differ by design. Every behaviour runs in every mode; these
/// are the only points where the expectation depends on the mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contract {
    /// A claim holds a lease: it commits before the handler runs, is renewed by a heartbeat,
    /// and the `Retry-After` of a duplicate's 409 is estimated, at least 1 s and at most the
    /// lease left.
    ///
    /// `false` in single-commit mode: the running marker is an advisory lock held by the
    /// attempt's transaction, there is no lease to renew or estimate from, and a duplicate's
    /// `Retry-After` is always 1 s. A crashed attempt rolls back (claim included), so its retry
    /// runs at once: the crash test is `behaviour_single_commit.rs`'s
    /// `crash_rolls_back_everything_and_the_retry_runs_at_once`.
    pub leased: bool,
    /// The claim (and a takeover) is committed before the handler runs, so other requests
    /// see the running record at once: a different request with the key gets 422, and a stale
    /// holder's store calls are answered (fenced) at once.
    ///
    /// `false` in single-commit mode: the claim is uncommitted until the answer commits with
    /// it. Another request with the key sees only the lock, not the running fingerprint, so it
    /// gets 409 (422 once the answer is committed); a stale holder's `complete`, `renew` and
    /// `release` wait on the row lock of the running takeover, then find the new holder's
    /// record and are fenced.
    pub claim_committed_first: bool,
}

impl Contract {
    /// The default and transactional modes.
    pub const LEASED: Self = Self {
        leased: true,
        claim_committed_first: true,
    };

    /// Single-commit mode.
    pub const SINGLE_COMMIT: Self = Self {
        leased: false,
        claim_committed_first: false,
    };

    /// The `Retry-After` seconds a duplicate's 409 may carry while a fresh attempt runs:
    /// `leased` (what the lease left allows) in a leased mode, exactly 1 s in single-commit mode.
    pub fn retry_after(&self, leased: RangeInclusive<u64>) -> RangeInclusive<u64> {
        if self.leased {
            leased
        } else {
            1..=1
        }
    }

    /// Assert a 409 "in flight" whose `Retry-After` fits this mode with `lease` configured:
    /// 1 s to the lease when leased, exactly 1 s in single-commit mode.
    pub fn assert_in_flight(&self, reply: &Reply, lease: Duration) -> u64 {
        let retry_after = reply.assert_in_flight();
        let allowed = if self.leased {
            1..=lease.as_secs().max(1)
        } else {
            1..=1
        };
        assert!(
            allowed.contains(&retry_after),
            "Retry-After {retry_after} is not in {allowed:?} ({self:?})"
        );
        retry_after
    }

    /// What a different request with the key of a running attempt gets: 422 when the running
    /// claim is committed, 409 when it is not (single commit).
    pub fn mismatch_while_running(&self) -> StatusCode {
        if self.claim_committed_first {
            StatusCode::UNPROCESSABLE_ENTITY
        } else {
            StatusCode::CONFLICT
        }
    }
}
