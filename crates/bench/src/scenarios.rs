//! The scenarios of a store and the run that alternates them.
//!
//! A store's group is its bare handlers, then, for the layer in each mode, `first-time keys`,
//! `replays` and `hot key`. The scenarios of a group run in alternating rounds (slices of
//! `seconds / rounds`, the starting scenario rotating), so a change in the machine's load falls
//! on all of them alike; every ratio is against the group's first bare row.

use std::{sync::Arc, time::Duration};

use crate::{
    cli::Settings,
    load::{create_keys, drive, send_each, Keys, Measured},
    stores::{BatchSource, Batches, Route, Setup, Started, StoreKind},
    wire::{self, Counted},
    BoxError,
};

/// The layered scenarios, in the order of each mode's rows.
pub const LAYERED: [&str; 3] = ["first-time keys", "replays", "hot key"];

/// One line of the table: a server, and how its requests pick their keys.
struct Scenario {
    store: &'static str,
    name: &'static str,
    url: String,
    keys: Plan,
    batches: Option<BatchSource>,
}

/// How a scenario's requests pick their keys, round after round.
#[derive(Clone)]
enum Plan {
    /// A new key per request.
    Unique,
    /// Keys created before the first round, requested over and over.
    Existing(Arc<Vec<String>>),
    /// One key for every request, a new one each round (so each round starts with its execution).
    Hot,
}

impl Plan {
    fn keys(&self) -> Keys {
        match self {
            Plan::Unique => Keys::Unique,
            Plan::Existing(keys) => Keys::Existing(keys.clone()),
            Plan::Hot => Keys::Hot(Arc::from(uuid::Uuid::new_v4().to_string())),
        }
    }
}

/// One measured scenario.
pub struct Row {
    /// Concurrent workers.
    pub workers: usize,
    /// The store and mode: `postgres (standard)`; a bare row has the store's name alone.
    pub store: &'static str,
    /// `bare`, `first-time keys`, ...
    pub scenario: &'static str,
    /// What the workers measured.
    pub measured: Measured,
    /// The group's bare handler's requests/s, in the same rounds.
    pub bare_per_second: f64,
    /// The store's batches during this scenario's slices, if it batches.
    pub batches: Option<Batches>,
}

impl Row {
    /// Requests/s over the bare handler's.
    pub fn ratio(&self) -> Option<f64> {
        (self.bare_per_second > 0.0).then(|| self.measured.per_second() / self.bare_per_second)
    }
}

/// The bench: its settings, one HTTP client for every run, and what it measured.
pub struct Bench {
    settings: Settings,
    client: reqwest::Client,
    /// Every scenario measured, in order.
    pub rows: Vec<Row>,
    /// Round trips and statements per request, per scenario counted on the wire.
    pub counted: Vec<Counted>,
}

impl Bench {
    /// A bench that has measured nothing yet.
    pub fn new(settings: Settings, client: reqwest::Client) -> Self {
        Self {
            settings,
            client,
            rows: Vec::new(),
            counted: Vec::new(),
        }
    }

    /// Measure `store` at `workers`: its group in alternating rounds, then, for a store on a
    /// server, its messages per request through the counting proxy.
    pub async fn run(&mut self, store: StoreKind, workers: usize) -> Result<(), BoxError> {
        let setup = Setup {
            workers: self.settings.max_workers(),
            preload: self.settings.preload,
            route: Route::Direct,
        };
        let started = store
            .start(&setup)
            .await?
            .ok_or("the store did not start")?;
        let scenarios = self.scenarios(&started, workers).await?;
        self.group(scenarios, workers).await;
        started.stop().await?;
        let counted = Setup {
            workers,
            route: Route::Counted,
            ..setup
        };
        if let Some(started) = store.start(&counted).await? {
            let counts = count(&self.client, &started, workers).await;
            started.stop().await?;
            self.counted.extend(counts?);
        }
        Ok(())
    }

    /// The bare scenarios, then the three layered ones of each mode.
    async fn scenarios(
        &self,
        started: &Started,
        workers: usize,
    ) -> Result<Vec<Scenario>, BoxError> {
        let mut out: Vec<Scenario> = started
            .bare
            .iter()
            .map(|bare| Scenario {
                store: started.store,
                name: bare.name,
                url: bare.url.clone(),
                keys: Plan::Unique,
                batches: None,
            })
            .collect();
        for mode in &started.layered {
            let keys = create_keys(&self.client, &mode.url, self.settings.keys, workers).await?;
            for (name, keys) in
                LAYERED
                    .into_iter()
                    .zip([Plan::Unique, Plan::Existing(keys), Plan::Hot])
            {
                out.push(Scenario {
                    store: mode.label,
                    name,
                    url: mode.url.clone(),
                    keys,
                    batches: mode.batches.clone(),
                });
            }
        }
        Ok(out)
    }

    /// Run a group of scenarios (the first one a bare handler) in alternating rounds.
    ///
    /// Each scenario gets a warm-up, then `rounds` slices of `duration / rounds`, interleaved with
    /// the other scenarios' slices (the starting scenario rotates each round), so drift in the
    /// machine's load falls on every scenario alike. The ratio is against the group's bare run.
    async fn group(&mut self, scenarios: Vec<Scenario>, workers: usize) {
        let rounds = self.settings.rounds;
        let slice = self.settings.duration / rounds;
        let warmup = (self.settings.duration / 5).min(Duration::from_secs(1));
        for s in &scenarios {
            drive(&self.client, &s.url, &s.keys.keys(), workers, warmup).await;
        }
        let mut totals: Vec<(Measured, Option<Batches>)> = scenarios
            .iter()
            .map(|s| {
                (
                    Measured::empty(),
                    s.batches.as_ref().map(|_| Batches::default()),
                )
            })
            .collect();
        for round in 0..rounds as usize {
            for i in 0..scenarios.len() {
                let i = (i + round) % scenarios.len();
                let s = &scenarios[i];
                let before = s.batches.as_ref().map(|read| read());
                let m = drive(&self.client, &s.url, &s.keys.keys(), workers, slice).await;
                let (measured, batches) = &mut totals[i];
                measured.merge(m);
                if let (Some(read), Some(before), Some(batches)) = (&s.batches, before, batches) {
                    batches.add(read().since(before));
                }
            }
        }
        let bare = totals[0].0.per_second();
        for (s, (measured, batches)) in scenarios.iter().zip(totals) {
            eprintln!(
                "  {:<26} {:<16} {:>8.0} req/s  p50 {:>9}  p99 {:>9}  ({})",
                s.store,
                s.name,
                measured.per_second(),
                crate::load::ms(measured.hist.value_at_quantile(0.5)),
                crate::load::ms(measured.hist.value_at_quantile(0.99)),
                measured.mix()
            );
            self.rows.push(Row {
                workers,
                store: s.store,
                scenario: s.name,
                measured,
                bare_per_second: bare,
                batches,
            });
        }
    }
}

/// Requests counted per scenario at one worker (more workers send more: ten each).
const REQUESTS: usize = 200;

/// Count the bare handlers' requests, and the first-time keys and replays of every mode, of a
/// store started through the counting proxy, `workers` requests at a time.
pub async fn count(
    client: &reqwest::Client,
    started: &Started,
    workers: usize,
) -> Result<Vec<Counted>, BoxError> {
    let counter = started
        .wire
        .as_ref()
        .ok_or("the store was not started through the counting proxy")?;
    let mut scenarios = Vec::new();
    for bare in &started.bare {
        scenarios.push((format!("{} {}", started.store, bare.name), &bare.url, false));
    }
    for mode in &started.layered {
        scenarios.push((format!("{} first-time keys", mode.label), &mode.url, false));
        scenarios.push((format!("{} replays", mode.label), &mode.url, true));
    }
    let warm_workers = wire::connections(workers);
    let requests = REQUESTS.max(10 * workers);
    let mut out = Vec::new();
    for (scenario, url, replay) in scenarios {
        // Warm up: every connection prepares its statements.
        let warm = create_keys(client, url, 10 * warm_workers, warm_workers).await?;
        let keys: Arc<Vec<String>> = Arc::new(if replay {
            (0..requests)
                .map(|i| warm[i % warm.len()].clone())
                .collect()
        } else {
            let run = uuid::Uuid::new_v4().simple().to_string();
            (0..requests).map(|i| format!("{run}-c{i}")).collect()
        });
        let before = counter.snapshot();
        send_each(client, url, &keys, workers).await?;
        let used = counter.snapshot().since(before);
        let per = |n: u64| n as f64 / requests as f64;
        let counted = Counted {
            workers,
            scenario,
            round_trips: per(used.round_trips),
            statements: used.statements.map(per),
        };
        eprintln!(
            "  {:<44} {:.2} round trips, {} statements per request ({workers} workers)",
            counted.scenario,
            counted.round_trips,
            counted.statements.map_or("-".into(), |s| format!("{s:.2}"))
        );
        out.push(counted);
    }
    Ok(out)
}
