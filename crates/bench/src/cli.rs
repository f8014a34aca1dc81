//! The command line, and the settings it resolves to.

use std::{path::PathBuf, time::Duration};

use clap::Parser;

use crate::stores::StoreKind;

/// Throughput and latency of one handler served with and without the idempotency layer.
#[derive(Debug, Parser)]
#[command(name = "tower-idempotency-bench")]
pub struct Cli {
    /// Stores to run: `all`, or a comma-separated list of `memory`, `redis`, `postgres`,
    /// `sqlite`, `mysql`.
    #[arg(long, env = "BENCH_STORE", default_value = "all", value_parser = parse_stores)]
    store: Stores,
    /// Seconds per scenario (and worker count), split over the rounds [default: 5; 1 with --quick].
    #[arg(long, env = "BENCH_SECONDS", value_parser = parse_seconds)]
    seconds: Option<f64>,
    /// Concurrent workers; every store runs once per value.
    #[arg(
        long,
        visible_alias = "concurrency",
        env = "BENCH_WORKERS",
        value_delimiter = ',',
        default_value = "1,8,32,128",
        value_parser = clap::value_parser!(u16).range(1..=1024)
    )]
    workers: Vec<u16>,
    /// Keys created beforehand for the replay scenario [default: 1000; 200 with --quick].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    keys: Option<u32>,
    /// Alternating rounds per scenario [default: 5; 1 with --quick].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: Option<u32>,
    /// Records written into the PostgreSQL table before the runs (an index that is not
    /// cache-hot).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    preload: u64,
    /// Where to write the SVG chart of requests/s against workers.
    #[arg(long, value_name = "FILE.svg")]
    chart: Option<PathBuf>,
    /// A short run (1 s per scenario in 1 round, 200 replay keys): every store at four worker
    /// counts in a few minutes. Explicit --seconds, --rounds and --keys still win.
    #[arg(long)]
    quick: bool,
}

/// The stores picked by `--store`, in the order they run.
#[derive(Debug, Clone)]
struct Stores(Vec<StoreKind>);

/// What one run of the bench does.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The stores, in the order they run.
    pub stores: Vec<StoreKind>,
    /// Time per scenario, split over the rounds.
    pub duration: Duration,
    /// Worker counts, in the order they run.
    pub workers: Vec<usize>,
    /// Keys created beforehand for the replay scenario.
    pub keys: usize,
    /// Alternating rounds per scenario.
    pub rounds: u32,
    /// Records written into the PostgreSQL table before the runs.
    pub preload: u64,
    /// Where to write the chart, if anywhere.
    pub chart: Option<PathBuf>,
}

impl Settings {
    /// The largest worker count of the run.
    pub fn max_workers(&self) -> usize {
        self.workers.iter().copied().max().unwrap_or(1)
    }
}

impl Cli {
    /// The settings, with `--quick`'s shorter defaults where nothing was given.
    pub fn settings(self) -> Settings {
        let (seconds, rounds, keys) = if self.quick {
            (1.0, 1, 200)
        } else {
            (5.0, 5, 1000)
        };
        Settings {
            stores: self.store.0,
            duration: Duration::from_secs_f64(self.seconds.unwrap_or(seconds)),
            workers: self.workers.into_iter().map(usize::from).collect(),
            keys: self.keys.unwrap_or(keys) as usize,
            rounds: self.rounds.unwrap_or(rounds),
            preload: self.preload,
            chart: self.chart,
        }
    }
}

fn parse_stores(text: &str) -> Result<Stores, String> {
    if text == "all" {
        return Ok(Stores(StoreKind::ALL.to_vec()));
    }
    let names = || {
        StoreKind::ALL
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    text.split(',')
        .map(|name| {
            let name = name.trim();
            StoreKind::ALL
                .iter()
                .copied()
                .find(|s| s.name() == name)
                .ok_or_else(|| format!("unknown store {name:?}: use all, or some of {}", names()))
        })
        .collect::<Result<_, _>>()
        .map(Stores)
}

fn parse_seconds(text: &str) -> Result<f64, String> {
    text.parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 600.0)
        .ok_or_else(|| format!("--seconds must be a number in (0, 600], got {text:?}"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn quick_shortens_only_what_was_not_given() {
        let settings = Cli::parse_from([
            "bench",
            "--quick",
            "--seconds",
            "3",
            "--store",
            "sqlite,memory",
        ])
        .settings();
        assert_eq!(settings.duration, Duration::from_secs(3));
        assert_eq!(settings.rounds, 1);
        assert_eq!(settings.keys, 200);
        assert_eq!(settings.workers, [1, 8, 32, 128]);
        assert_eq!(settings.stores, [StoreKind::Sqlite, StoreKind::Memory]);
    }

    #[test]
    fn a_store_that_does_not_exist_is_refused_with_the_names() {
        let err = Cli::try_parse_from(["bench", "--store", "mongo"]).unwrap_err();
        assert!(
            err.to_string().contains("memory, redis, postgres, sqlite"),
            "{err}"
        );
    }
}
