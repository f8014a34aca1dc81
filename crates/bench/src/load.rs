//! The load: workers sending requests with keys picked by a [`Keys`], and what they measured.

use std::{
    fmt::Write as _,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use axum::http::StatusCode;
use hdrhistogram::Histogram;

use crate::BoxError;

/// The body of every request: one order.
pub const BODY: &str = r#"{"customerId": "c_1", "totalCents": 4000}"#;

/// Which `Idempotency-Key` each request carries.
#[derive(Clone)]
pub enum Keys {
    /// A new key for every request.
    Unique,
    /// Round-robin over keys that were used once beforehand.
    Existing(Arc<Vec<String>>),
    /// The same key for every request.
    Hot(Arc<str>),
}

impl Keys {
    pub fn key(&self, worker: usize, seq: u64, run: &str) -> String {
        match self {
            Keys::Unique => format!("{run}-{worker}-{seq}"),
            Keys::Existing(keys) => {
                let i = (worker as u64).wrapping_mul(7919).wrapping_add(seq) as usize;
                keys[i % keys.len()].clone()
            }
            Keys::Hot(key) => key.to_string(),
        }
    }
}

#[derive(Default)]
pub struct Tally {
    created: u64,
    replayed: u64,
    in_flight: u64,
    other: u64,
    errors: u64,
}

pub struct Measured {
    pub hist: Histogram<u64>,
    pub tally: Tally,
    pub elapsed: Duration,
}

impl Measured {
    pub fn empty() -> Self {
        Self {
            hist: histogram(),
            tally: Tally::default(),
            elapsed: Duration::ZERO,
        }
    }

    pub fn merge(&mut self, other: Measured) {
        self.hist.add(&other.hist).expect("same histogram bounds");
        self.tally.created += other.tally.created;
        self.tally.replayed += other.tally.replayed;
        self.tally.in_flight += other.tally.in_flight;
        self.tally.other += other.tally.other;
        self.tally.errors += other.tally.errors;
        self.elapsed += other.elapsed;
    }

    pub fn requests(&self) -> u64 {
        self.hist.len()
    }

    pub fn per_second(&self) -> f64 {
        self.requests() as f64 / self.elapsed.as_secs_f64()
    }

    pub fn mix(&self) -> String {
        let t = &self.tally;
        let mut s = String::new();
        for (n, label) in [
            (t.created, "201"),
            (t.replayed, "201 replayed"),
            (t.in_flight, "409"),
            (t.other, "other"),
            (t.errors, "transport errors"),
        ] {
            if n > 0 {
                if !s.is_empty() {
                    s.push_str(", ");
                }
                let _ = write!(s, "{n} {label}");
            }
        }
        s
    }
}

fn histogram() -> Histogram<u64> {
    // Microseconds, 1 us to 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// `concurrency` workers, each sending one request at a time to `url` until `duration` passed.
pub async fn drive(
    client: &reqwest::Client,
    url: &str,
    keys: &Keys,
    concurrency: usize,
    duration: Duration,
) -> Measured {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let start = Instant::now();
    let deadline = start + duration;
    let workers: Vec<_> = (0..concurrency)
        .map(|worker| {
            let client = client.clone();
            let url = url.to_owned();
            let keys = keys.clone();
            let run = run.clone();
            tokio::spawn(async move {
                let mut hist = histogram();
                let mut tally = Tally::default();
                let mut seq = 0u64;
                while Instant::now() < deadline {
                    let key = keys.key(worker, seq, &run);
                    seq += 1;
                    let sent = Instant::now();
                    let result = client
                        .post(&url)
                        .header("Idempotency-Key", key)
                        .header("Content-Type", "application/json")
                        .body(BODY)
                        .send()
                        .await;
                    let response = match result {
                        Ok(r) => r,
                        Err(_) => {
                            tally.errors += 1;
                            continue;
                        }
                    };
                    let status = response.status();
                    let replayed = response.headers().contains_key("idempotent-replayed");
                    if response.bytes().await.is_err() {
                        tally.errors += 1;
                        continue;
                    }
                    let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                    hist.saturating_record(micros.max(1));
                    match status.as_u16() {
                        201 if replayed => tally.replayed += 1,
                        201 => tally.created += 1,
                        409 => tally.in_flight += 1,
                        _ => tally.other += 1,
                    }
                }
                (hist, tally)
            })
        })
        .collect();
    let mut total = Measured::empty();
    for worker in workers {
        let (hist, tally) = worker.await.expect("worker task");
        total.merge(Measured {
            hist,
            tally,
            elapsed: Duration::ZERO,
        });
    }
    total.elapsed = start.elapsed();
    total
}

/// Send each of `n` new keys once (with `concurrency` in flight), for the replay scenario.
pub async fn create_keys(
    client: &reqwest::Client,
    url: &str,
    n: usize,
    concurrency: usize,
) -> Result<Arc<Vec<String>>, BoxError> {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let keys: Arc<Vec<String>> = Arc::new((0..n).map(|i| format!("{run}-r{i}")).collect());
    send_each(client, url, &keys, concurrency).await?;
    Ok(keys)
}

/// Send one request per entry of `keys` (with `concurrency` in flight); every answer must be 201.
pub async fn send_each(
    client: &reqwest::Client,
    url: &str,
    keys: &Arc<Vec<String>>,
    concurrency: usize,
) -> Result<(), BoxError> {
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..concurrency.min(keys.len()))
        .map(|_| {
            let (client, url, keys, next) =
                (client.clone(), url.to_owned(), keys.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(key) = keys.get(i) else {
                        return Ok::<(), String>(());
                    };
                    let response = client
                        .post(&url)
                        .header("Idempotency-Key", key)
                        .header("Content-Type", "application/json")
                        .body(BODY)
                        .send()
                        .await
                        .map_err(|e| e.to_string())?;
                    if response.status() != StatusCode::CREATED {
                        return Err(format!("{url} answered {}", response.status()));
                    }
                    response.bytes().await.map_err(|e| e.to_string())?;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }
    Ok(())
}

/// Microseconds as milliseconds with two decimals.
pub fn ms(micros: u64) -> String {
    format!("{:.2} ms", micros as f64 / 1000.0)
}
