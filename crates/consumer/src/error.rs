/// Why [`Consumer::process_once`](crate::Consumer::process_once) did not finish, generic over
/// the work's own error `E`.
///
/// The work's error comes back untouched in [`Error::Work`] or [`Error::Parked`]; everything
/// else is the backend's. Nothing was marked processed: a redelivery runs the work (with one
/// exception, a commit whose answer was lost: see [`Error::Database`]), unless it was parked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error<E> {
    /// The work returned an error; its transaction was rolled back (or its claim released) and
    /// the failed attempt counted. Redeliver the event.
    #[error("the event's work failed")]
    Work(#[source] E),
    /// The work returned an error on its last allowed attempt: rolled back, and the event is now
    /// parked. Acknowledge the delivery; later deliveries report
    /// [`Outcome::Parked`](crate::Outcome::Parked) until it is replayed.
    #[error("the event's work failed on its last allowed attempt; the event is parked")]
    Parked(#[source] E),
    /// The delivery carried no event id (a broker message without its id property or header):
    /// it cannot be deduplicated, so the work did not run. Redelivering it would not help.
    #[error("the delivery carries no event id, so it cannot be deduplicated")]
    MissingEventId,
    /// The event id cannot be recorded: longer than [`MAX_EVENT_ID_LEN`](crate::MAX_EVENT_ID_LEN)
    /// bytes, or holding a NUL character (which PostgreSQL's text refuses). The work did not
    /// run, and no redelivery of the same id would mend it.
    #[error(
        "the event id cannot be recorded: at most {} bytes and no NUL character",
        crate::MAX_EVENT_ID_LEN
    )]
    InvalidEventId,
    /// The database failed: beginning, the dedupe insert, the commit or a rollback.
    ///
    /// If the commit itself failed on a lost connection the outcome is unknown; the next
    /// delivery settles it (`Duplicate` if it had committed).
    #[cfg(feature = "sqlx")]
    #[error("the processed-events database failed")]
    Database(#[source] sqlx::Error),
    /// Redis failed: the claim or the completion.
    #[cfg(feature = "redis")]
    #[error("the processed-events Redis failed")]
    Redis(#[source] redis::RedisError),
    /// The claim's lease passed (or was taken over) before the work finished.
    ///
    /// Another delivery may be running the work now. If the work was still running it was
    /// cancelled at its next `.await`; if it had finished, its effects stand but the event was
    /// not marked done.
    #[cfg(feature = "redis")]
    #[error("the event's claim lapsed before the work finished")]
    LeaseLost,
}

impl<E> Error<E> {
    /// Whether the delivery should be redelivered (nacked): every error but
    /// [`Parked`](Error::Parked), which is settled, and [`MissingEventId`](Error::MissingEventId)
    /// and [`InvalidEventId`](Error::InvalidEventId), which no redelivery mends.
    pub fn should_redeliver(&self) -> bool {
        !matches!(
            self,
            Error::Parked(_) | Error::MissingEventId | Error::InvalidEventId
        )
    }
}

#[cfg(feature = "sqlx")]
impl<E> From<sqlx::Error> for Error<E> {
    fn from(err: sqlx::Error) -> Self {
        Error::Database(err)
    }
}

#[cfg(feature = "redis")]
impl<E> From<redis::RedisError> for Error<E> {
    fn from(err: redis::RedisError) -> Self {
        Error::Redis(err)
    }
}

/// Refuse an event id no store can record, before any store is asked: a database error on it
/// would not be counted as a failed attempt, so its delivery would come back for ever.
#[cfg(any(
    feature = "sqlx",
    feature = "redis",
    feature = "rabbitmq",
    feature = "nats"
))]
pub(crate) fn check_event_id<E>(event_id: &str) -> Result<(), Error<E>> {
    if event_id.len() > crate::MAX_EVENT_ID_LEN || event_id.contains('\0') {
        return Err(Error::InvalidEventId);
    }
    Ok(())
}

/// What a failed attempt records for a work that panicked: the panic's message when it has one.
#[cfg(any(feature = "sqlx", feature = "redis"))]
pub(crate) fn panicked(panic: &(dyn std::any::Any + Send)) -> String {
    let message = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str));
    match message {
        Some(message) => format!("the work panicked: {message}"),
        None => "the work panicked".to_owned(),
    }
}
