//! SQLite's result codes, sorted into [`StoreErrorKind`]s.

use crate::store::error::StoreErrorKind;

/// The kind of a SQLite error, from its result code.
pub(in crate::store) fn kind(err: &dyn sqlx::error::DatabaseError) -> StoreErrorKind {
    // SQLite reports its (extended) result code as a number; the primary code is the low byte.
    let code = err.code().and_then(|c| c.parse::<u32>().ok()).unwrap_or(0);
    match code & 0xff {
        // BUSY, LOCKED: another connection holds the lock past the busy timeout.
        5 | 6 => StoreErrorKind::Conflict,
        // NOMEM, IOERR, FULL (disk), CANTOPEN, PROTOCOL
        7 | 10 | 13 | 14 | 15 => StoreErrorKind::Unavailable,
        _ => StoreErrorKind::Backend,
    }
}
