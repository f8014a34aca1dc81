//! The figures of a run, and the side-by-side table.

use std::fmt;

use crate::{stats::Expected, Settings};

/// What one client did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientReport {
    /// Orders it was asked to place.
    pub intents: u64,
    /// Requests it sent.
    pub attempts: u64,
    /// Intents that never got their 201.
    pub failed: u64,
    /// Answers the proxy dropped after the server did the work.
    pub dropped: u64,
    /// Orders in the database.
    pub orders: u64,
    /// Orders beyond one per intent.
    pub duplicates: u64,
}

/// Both clients, side by side.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report {
    /// The run's parameters.
    pub settings: Settings,
    /// The client that retries with a new key per attempt.
    pub naive: ClientReport,
    /// The client that keeps one key per intent.
    pub idempotent: ClientReport,
}

impl Report {
    /// The naive client's expected duplicates for this run.
    pub fn expected_naive(&self) -> Expected {
        Expected::naive_duplicates(self.naive.intents, self.settings.loss_rate)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        let expected = self.expected_naive();
        writeln!(
            f,
            "{} orders per client through a proxy that drops {}% of answers after the work is done (seed {})\n",
            s.orders,
            s.loss_rate * 100.0,
            s.seed
        )?;
        let row = |f: &mut fmt::Formatter<'_>, label: &str, a: String, b: String| {
            writeln!(f, "| {label:<22} | {a:>24} | {b:>24} |")
        };
        row(f, "", "naive client".into(), "idempotent client".into())?;
        row(
            f,
            "",
            "(new key per attempt)".into(),
            "(one key per intent)".into(),
        )?;
        writeln!(f, "|{:-<24}|{:->26}|{:->26}|", "", "", "")?;
        let (a, b) = (&self.naive, &self.idempotent);
        row(f, "intents", a.intents.to_string(), b.intents.to_string())?;
        row(
            f,
            "attempts",
            a.attempts.to_string(),
            b.attempts.to_string(),
        )?;
        row(
            f,
            "answers dropped",
            a.dropped.to_string(),
            b.dropped.to_string(),
        )?;
        row(
            f,
            "orders created",
            a.orders.to_string(),
            b.orders.to_string(),
        )?;
        row(
            f,
            "duplicate orders",
            a.duplicates.to_string(),
            b.duplicates.to_string(),
        )?;
        row(
            f,
            "expected duplicates",
            format!("{:.1} ± {:.1}", expected.mean, expected.sd),
            "0".into(),
        )?;
        row(
            f,
            "intents failed",
            a.failed.to_string(),
            b.failed.to_string(),
        )?;
        writeln!(
            f,
            "\nexpected = n·p/(1−p) ± √(n·p)/(1−p) (geometric retries, 1σ); the naive client is {:.1}σ from it",
            expected.sigmas(a.duplicates)
        )
    }
}
