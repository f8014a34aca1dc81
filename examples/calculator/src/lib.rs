//! What lost answers cost without idempotency keys, and what the key store costs with them.
//!
//! Run with: `cargo run -p calculator -- --requests-per-day 20000 --timeout-rate 0.2%`
//!
//! A request that times out after the server did its work is retried by a naive client, and the
//! work is done twice: one duplicate. With one `Idempotency-Key` per intent, the retry replays
//! the first answer instead; the price is one stored record per request for the retention.
//!
//! ```
//! let inputs = calculator::Inputs::default();
//! let estimate = calculator::estimate(&inputs);
//! assert_eq!(estimate.duplicates_per_month.round(), 600.0);
//! ```

use std::{fmt::Write as _, time::Duration};

/// The days a month counts.
pub const DAYS_PER_MONTH: f64 = 30.0;

/// Requests per day when not given.
pub const DEFAULT_REQUESTS_PER_DAY: f64 = 20_000.0;
/// The share of requests that time out when not given (0.2 %).
pub const DEFAULT_TIMEOUT_RATE: f64 = 0.002;
/// The share of timed-out requests whose work succeeded on the server when not given.
pub const DEFAULT_SUCCEEDED_SHARE: f64 = 0.5;
/// The average order value in dollars when not given.
pub const DEFAULT_ORDER_VALUE: f64 = 40.0;
/// How long keys are kept when not given.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// The size of one stored record (key, fingerprint, saved answer) when not given.
pub const DEFAULT_RECORD_BYTES: u64 = 1_000;

/// The traffic and the costs to estimate from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Inputs {
    /// Keyed requests (orders placed) per day.
    pub requests_per_day: f64,
    /// The share of requests whose answer never reaches the client (0 to 1).
    pub timeout_rate: f64,
    /// The share of those whose work was done anyway (0 to 1).
    pub succeeded_share: f64,
    /// The average value of one order, in dollars.
    pub order_value: f64,
    /// How long the server keeps each key and its answer.
    pub retention: Duration,
    /// The bytes one stored record takes.
    pub record_bytes: u64,
}

impl Default for Inputs {
    /// The `DEFAULT_*` constants: 20,000 requests a day, 0.2 % timeouts, half of them done
    /// anyway, $40 orders, 24 h retention, 1 KB records.
    fn default() -> Self {
        Self {
            requests_per_day: DEFAULT_REQUESTS_PER_DAY,
            timeout_rate: DEFAULT_TIMEOUT_RATE,
            succeeded_share: DEFAULT_SUCCEEDED_SHARE,
            order_value: DEFAULT_ORDER_VALUE,
            retention: DEFAULT_RETENTION,
            record_bytes: DEFAULT_RECORD_BYTES,
        }
    }
}

/// What the inputs cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Requests per day whose answer was lost.
    pub timeouts_per_day: f64,
    /// Orders placed twice per day by a client that retries without a key.
    pub duplicates_per_day: f64,
    /// The same over [`DAYS_PER_MONTH`].
    pub duplicates_per_month: f64,
    /// The value of a month's duplicate orders, in dollars: refunds, chargebacks, support.
    pub money_at_risk_per_month: f64,
    /// Records the key store holds at any time: one per request of the retention window.
    pub records_kept: f64,
    /// The bytes those records take.
    pub store_bytes: f64,
}

/// Estimate the duplicates without keys and the key store's size with them.
pub fn estimate(inputs: &Inputs) -> Estimate {
    let timeouts_per_day = inputs.requests_per_day * inputs.timeout_rate;
    // A timeout whose work succeeded is retried and done again; one whose work failed is not.
    let duplicates_per_day = timeouts_per_day * inputs.succeeded_share;
    let duplicates_per_month = duplicates_per_day * DAYS_PER_MONTH;
    let retention_days = inputs.retention.as_secs_f64() / 86_400.0;
    let records_kept = inputs.requests_per_day * retention_days;
    Estimate {
        timeouts_per_day,
        duplicates_per_day,
        duplicates_per_month,
        money_at_risk_per_month: duplicates_per_month * inputs.order_value,
        records_kept,
        store_bytes: records_kept * inputs.record_bytes as f64,
    }
}

/// The report the CLI prints.
pub fn report(inputs: &Inputs, estimate: &Estimate) -> String {
    let mut out = String::new();
    let row = |out: &mut String, label: &str, value: String| {
        writeln!(out, "  {label:<32}{value}").expect("writing to a String");
    };
    out.push_str("Inputs\n");
    row(&mut out, "requests per day", count(inputs.requests_per_day));
    row(
        &mut out,
        "answers lost (timeouts)",
        format!(
            "{} ({} per day)",
            percent(inputs.timeout_rate),
            count(estimate.timeouts_per_day)
        ),
    );
    row(
        &mut out,
        "of which the work was done",
        percent(inputs.succeeded_share),
    );
    row(&mut out, "average order value", dollars(inputs.order_value));
    row(&mut out, "keys kept for", duration(inputs.retention));
    row(&mut out, "record size", bytes(inputs.record_bytes as f64));
    out.push_str("\nWithout idempotency keys (a retry does the work again)\n");
    row(
        &mut out,
        "duplicate orders per day",
        count(estimate.duplicates_per_day),
    );
    row(
        &mut out,
        "duplicate orders per month",
        format!(
            "{} ({} days)",
            count(estimate.duplicates_per_month),
            DAYS_PER_MONTH
        ),
    );
    row(
        &mut out,
        "money at risk per month",
        dollars(estimate.money_at_risk_per_month),
    );
    out.push_str("\nWith idempotency keys (a retry replays the first answer)\n");
    row(&mut out, "duplicate orders", "0".to_owned());
    row(
        &mut out,
        "key store size",
        format!(
            "about {} ({} records of {})",
            bytes(estimate.store_bytes),
            count(estimate.records_kept),
            bytes(inputs.record_bytes as f64)
        ),
    );
    out
}

/// A count with thousands separators; one decimal when it is not (nearly) whole.
fn count(value: f64) -> String {
    if (value - value.round()).abs() < 0.05 {
        group(value.round() as u64)
    } else {
        let tenths = (value * 10.0).round() as u64;
        format!("{}.{}", group(tenths / 10), tenths % 10)
    }
}

/// Whole dollars with thousands separators (cents when under $100).
fn dollars(value: f64) -> String {
    if value < 100.0 && (value - value.round()).abs() >= 0.005 {
        format!("${value:.2}")
    } else {
        format!("${}", group(value.round() as u64))
    }
}

fn percent(share: f64) -> String {
    let value = share * 100.0;
    // Up to three decimals, no trailing zeros: 0.2%, 50%, 0.125%.
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}%")
}

fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs.is_multiple_of(86_400) && secs >= 7 * 86_400 {
        format!("{}d", secs / 86_400)
    } else if secs.is_multiple_of(3600) {
        format!("{}h", secs / 3600)
    } else if secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

/// Decimal units (1 KB = 1,000 bytes), one decimal under 10 of a unit.
fn bytes(value: f64) -> String {
    let units = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut value = value;
    let mut unit = 0;
    while value >= 1000.0 && unit < units.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if value < 10.0 && (value - value.round()).abs() >= 0.05 {
        format!("{value:.1} {}", units[unit])
    } else {
        format!("{} {}", value.round(), units[unit])
    }
}

fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Parse a share: `0.2%` or `0.002`, between 0 and 1.
pub fn parse_share(text: &str) -> Result<f64, String> {
    let text = text.trim();
    let (number, scale) = match text.strip_suffix('%') {
        Some(number) => (number.trim(), 100.0),
        None => (text, 1.0),
    };
    let value = number
        .parse::<f64>()
        .ok()
        .map(|v| v / scale)
        .filter(|v| (0.0..=1.0).contains(v));
    value.ok_or_else(|| format!("`{text}` is not a share; write a percentage like 0.2% or a fraction between 0 and 1 like 0.002"))
}

/// Parse an amount of dollars: `40`, `$40`, `39.90`.
pub fn parse_dollars(text: &str) -> Result<f64, String> {
    let number = text.trim().trim_start_matches('$').replace(',', "");
    number
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("`{text}` is not an amount; write dollars like 40 or $39.90"))
}

/// Parse a duration: `24h`, `7d`, `90m`, `3600s` (a bare number is hours).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let seconds_per_unit = match unit.trim() {
        "s" => 1.0,
        "m" | "min" => 60.0,
        "" | "h" => 3600.0,
        "d" => 86_400.0,
        _ => f64::NAN,
    };
    number
        .parse::<f64>()
        .ok()
        .map(|n| n * seconds_per_unit)
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("`{text}` is not a duration; write it like 24h, 7d, 90m or 3600s"))
}

/// Parse a size: `1KB`, `1 KB`, `1000`, `1KiB`, `2MB` (KB = 1,000 bytes, KiB = 1,024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let multiplier = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "kib" => 1024.0,
        "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        _ => f64::NAN,
    };
    number
        .parse::<f64>()
        .ok()
        .map(|n| (n * multiplier).round())
        .filter(|b| b.is_finite() && *b >= 1.0)
        .map(|b| b as u64)
        .ok_or_else(|| format!("`{text}` is not a size; write it like 1KB, 1000, 1KiB or 2MB"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_case_gives_the_documented_numbers() {
        let estimate = estimate(&Inputs::default());
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
        assert!(close(estimate.timeouts_per_day, 40.0));
        assert!(close(estimate.duplicates_per_day, 20.0));
        assert!(close(estimate.duplicates_per_month, 600.0));
        assert!(close(estimate.money_at_risk_per_month, 24_000.0));
        assert!(close(estimate.records_kept, 20_000.0));
        assert!(close(estimate.store_bytes, 20_000_000.0));
    }

    #[test]
    fn the_report_prints_them() {
        let inputs = Inputs::default();
        let expected = "\
Inputs
  requests per day                20,000
  answers lost (timeouts)         0.2% (40 per day)
  of which the work was done      50%
  average order value             $40
  keys kept for                   24h
  record size                     1 KB

Without idempotency keys (a retry does the work again)
  duplicate orders per day        20
  duplicate orders per month      600 (30 days)
  money at risk per month         $24,000

With idempotency keys (a retry replays the first answer)
  duplicate orders                0
  key store size                  about 20 MB (20,000 records of 1 KB)
";
        assert_eq!(report(&inputs, &estimate(&inputs)), expected);
    }

    #[test]
    fn inputs_parse_in_the_forms_people_write() {
        assert_eq!(parse_share("0.2%").unwrap(), 0.002);
        assert_eq!(parse_share("0.002").unwrap(), 0.002);
        assert_eq!(parse_share("50%").unwrap(), 0.5);
        assert!(parse_share("50").unwrap_err().contains("0.2%"));
        assert_eq!(parse_dollars("$40").unwrap(), 40.0);
        assert_eq!(parse_dollars("1,250.5").unwrap(), 1250.5);
        assert!(parse_dollars("forty").is_err());
        assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86_400));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(604_800));
        assert_eq!(parse_duration("90m").unwrap(), Duration::from_secs(5_400));
        assert_eq!(parse_duration("48").unwrap(), Duration::from_secs(172_800));
        assert!(parse_duration("1 week").is_err());
        assert!(parse_duration("0h").is_err());
        assert_eq!(parse_size("1KB").unwrap(), 1_000);
        assert_eq!(parse_size("1 KiB").unwrap(), 1_024);
        assert_eq!(parse_size("2.5MB").unwrap(), 2_500_000);
        assert_eq!(parse_size("800").unwrap(), 800);
        assert!(parse_size("big").is_err());
    }

    #[test]
    fn other_inputs_scale() {
        let inputs = Inputs {
            requests_per_day: 1_000_000.0,
            timeout_rate: 0.001,
            succeeded_share: 0.25,
            order_value: 12.5,
            retention: Duration::from_secs(7 * 86_400),
            record_bytes: 2_500,
        };
        let estimate = estimate(&inputs);
        assert!((estimate.duplicates_per_day - 250.0).abs() < 1e-6);
        assert!((estimate.money_at_risk_per_month - 93_750.0).abs() < 1e-6);
        assert!((estimate.store_bytes - 17.5e9).abs() < 1.0);
        let text = report(&inputs, &estimate);
        assert!(
            text.contains("about 18 GB (7,000,000 records of 2.5 KB)"),
            "{text}"
        );
        assert!(
            text.contains("keys kept for                   7d"),
            "{text}"
        );
    }
}
