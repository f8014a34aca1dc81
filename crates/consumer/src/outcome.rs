/// What [`process_once`](crate#guarantees) did with one delivery of an event.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a Duplicate is not an error, but it usually changes what the caller answers"]
pub enum Outcome<T> {
    /// The work ran and committed, with the dedupe row, in one transaction; here is its value.
    Processed(T),
    /// The event was processed (and committed) before: the work did not run.
    Duplicate,
}

impl<T> Outcome<T> {
    /// Whether the work ran for this delivery.
    pub fn is_processed(&self) -> bool {
        matches!(self, Outcome::Processed(_))
    }

    /// Whether the event had been processed before.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate)
    }

    /// The work's value, if it ran.
    pub fn processed(self) -> Option<T> {
        match self {
            Outcome::Processed(value) => Some(value),
            Outcome::Duplicate => None,
        }
    }
}
