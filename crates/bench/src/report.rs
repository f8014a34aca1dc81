//! What the bench prints: every row measured, the ratios at each worker count, one worker's
//! latency, the messages per request counted on the wire, and the chart.

use std::fmt::Write as _;

use crate::{
    chart,
    cli::Settings,
    load::ms,
    scenarios::{Row, LAYERED},
    wire::Counted,
};

/// The whole report, as Markdown tables.
pub fn render(settings: &Settings, rows: &[Row], counted: &[Counted]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} s per scenario in {} alternating rounds, {:?} concurrent keep-alive workers, client and servers in one process on 127.0.0.1\n",
        settings.duration.as_secs_f64(),
        settings.rounds,
        settings.workers
    );
    out.push_str(&table(rows));
    out.push_str(&ratios(settings, rows, counted));
    out.push_str(&latency(settings, rows));
    if !counted.is_empty() {
        out.push_str(&messages(counted));
    }
    out
}

/// Every row measured.
fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| workers | store | scenario | requests/s | p50 | p99 | vs bare (req/s) | answers |"
    );
    let _ = writeln!(out, "|---:|---|---|---:|---:|---:|---:|---|");
    for row in rows {
        let m = &row.measured;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {} | {} | {} | {} |",
            row.workers,
            row.store,
            row.scenario,
            m.per_second(),
            ms(m.hist.value_at_quantile(0.5)),
            ms(m.hist.value_at_quantile(0.99)),
            row.ratio().map(|r| format!("{r:.2}x")).unwrap_or_default(),
            m.mix()
        );
    }
    out
}

/// Per store and mode, one line per scenario with its ratio to the bare handler at each worker
/// count; then the mean batch size of the first-time keys (for a store that batches) and their
/// round trips per request on the wire (for a store on a server).
fn ratios(settings: &Settings, rows: &[Row], counted: &[Counted]) -> String {
    let mut out = String::new();
    let workers = &settings.workers;
    let _ = writeln!(
        out,
        "\nRatio to the bare handler of the same store, in the same run, by concurrent workers:\n"
    );
    let heads: String = workers.iter().map(|w| format!(" {w} |")).collect();
    let rules: String = workers.iter().map(|_| "---:|").collect();
    let _ = writeln!(out, "| store / mode | scenario |{heads}\n|---|---|{rules}");
    let cells = |value: &dyn Fn(usize) -> Option<String>| -> String {
        workers
            .iter()
            .map(|&w| format!(" {} |", value(w).unwrap_or_else(|| "-".into())))
            .collect()
    };
    let find = |store: &str, scenario: &str, w: usize| {
        rows.iter()
            .find(|r| r.store == store && r.scenario == scenario && r.workers == w)
    };
    for (store, scenario) in lines(rows) {
        let ratio = |w| {
            find(store, scenario, w)?
                .ratio()
                .map(|r| format!("{r:.2}x"))
        };
        let _ = writeln!(out, "| {store} | {scenario} |{}", cells(&ratio));
        if scenario != LAYERED[2] {
            continue;
        }
        if rows.iter().any(|r| r.store == store && r.batches.is_some()) {
            let batch = |w| {
                let batches = find(store, LAYERED[0], w)?.batches?;
                Some(
                    batches
                        .mean_size()
                        .map_or("no batch".into(), |m| format!("{m:.1}")),
                )
            };
            let _ = writeln!(
                out,
                "| {store} | mean batch (first-time) |{}",
                cells(&batch)
            );
        }
        let name = format!("{store} {}", LAYERED[0]);
        if counted.iter().any(|c| c.scenario == name) {
            let trips = |w| {
                let c = counted
                    .iter()
                    .find(|c| c.scenario == name && c.workers == w)?;
                Some(format!("{:.2}", c.round_trips))
            };
            let _ = writeln!(
                out,
                "| {store} | round trips per first-time request |{}",
                cells(&trips)
            );
        }
    }
    out
}

/// The (store, scenario) lines of the ratio table, in the order they were first measured, the
/// reference bare rows left out.
fn lines(rows: &[Row]) -> Vec<(&'static str, &'static str)> {
    let mut lines: Vec<(&'static str, &'static str)> = Vec::new();
    for row in rows {
        let line = (row.store, row.scenario);
        if row.scenario != "bare" && !lines.contains(&line) {
            lines.push(line);
        }
    }
    lines
}

/// p50 and p99 of every scenario at the fewest workers of the run (one, by default): the cost
/// of the layer to a lone request.
fn latency(settings: &Settings, rows: &[Row]) -> String {
    let fewest = settings.workers.iter().copied().min().unwrap_or(1);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nLatency at {fewest} worker{}:\n\n| store | scenario | p50 | p99 |\n|---|---|---:|---:|",
        if fewest == 1 { "" } else { "s" }
    );
    for row in rows.iter().filter(|r| r.workers == fewest) {
        let h = &row.measured.hist;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            row.store,
            row.scenario,
            ms(h.value_at_quantile(0.5)),
            ms(h.value_at_quantile(0.99))
        );
    }
    out
}

/// Messages per request to the store's server, counted by a proxy outside the timed runs.
fn messages(counted: &[Counted]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nMessages per request to the store's server (counted by a proxy, outside the timed runs):\n"
    );
    let _ = writeln!(
        out,
        "| workers | scenario | round trips | statements |\n|---:|---|---:|---:|"
    );
    for c in counted {
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {} |",
            c.workers,
            c.scenario,
            c.round_trips,
            c.statements.map_or("-".into(), |s| format!("{s:.2}"))
        );
    }
    out
}

/// Requests/s against workers: the bare rows and the first-time rows of every store and mode.
pub fn chart(rows: &[Row]) -> String {
    let mut series: Vec<chart::Series> = Vec::new();
    for row in rows {
        let bare = row.scenario.starts_with("bare");
        if !bare && row.scenario != LAYERED[0] {
            continue;
        }
        let label = if bare {
            format!("{} {}", row.store, row.scenario)
        } else {
            format!("{} first-time", row.store)
        };
        let point = (row.workers, row.measured.per_second());
        match series.iter_mut().find(|s| s.label == label) {
            Some(s) => s.points.push(point),
            None => series.push(chart::Series {
                label,
                bare,
                points: vec![point],
            }),
        }
    }
    for s in &mut series {
        s.points.sort_by_key(|p| p.0);
    }
    chart::svg(
        "requests/s against concurrent workers (dashed: without the layer)",
        &series,
    )
}
