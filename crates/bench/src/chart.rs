//! An SVG line chart of requests/s against workers, one line per store, mode and scenario.
//!
//! Written by hand (a few dozen SVG elements) rather than with a plotting crate: the chart is
//! simple, and plotters' text layout needs a font backend that would pull in font files.

use std::fmt::Write as _;

/// One line: its label, whether it is a bare handler (drawn dashed), and its points
/// (workers, requests/s), sorted by workers.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub bare: bool,
    pub points: Vec<(usize, f64)>,
}

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 560.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 330.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 12] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#000000", "#a05d00",
];

/// The chart as an SVG document.
pub fn svg(title: &str, series: &[Series]) -> String {
    let mut workers: Vec<usize> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    workers.sort_unstable();
    workers.dedup();
    let rps: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|r| *r > 0.0)
        .collect();
    // Requests/s on a log scale too: the stores differ by an order of magnitude.
    let y_min = decade_floor(rps.iter().copied().fold(f64::INFINITY, f64::min).min(1e9));
    let y_max = decade_ceiling(rps.iter().copied().fold(1.0_f64, f64::max)).max(y_min * 10.0);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    // Workers on a log scale, evenly spaced when they are powers of a common factor.
    let (lo, hi) = (
        (*workers.first().unwrap_or(&1) as f64).ln(),
        (*workers.last().unwrap_or(&1) as f64).ln(),
    );
    let x = |w: usize| {
        if hi > lo {
            LEFT + ((w as f64).ln() - lo) / (hi - lo) * plot_w
        } else {
            LEFT + plot_w / 2.0
        }
    };
    let y = |rps: f64| {
        let rps = rps.max(y_min);
        TOP + plot_h - (rps.ln() - y_min.ln()) / (y_max.ln() - y_min.ln()) * plot_h
    };

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="28" font-size="16" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        escape(title)
    );
    let mut decade = y_min;
    while decade <= y_max * 1.0001 {
        for (i, m) in [1.0, 2.0, 5.0].into_iter().enumerate() {
            let v = decade * m;
            if v > y_max * 1.0001 {
                break;
            }
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="{}"/>"##,
                LEFT + plot_w,
                if i == 0 { "#ccc" } else { "#eee" },
                y = y(v),
            );
            let _ = writeln!(
                out,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                LEFT - 8.0,
                y(v) + 4.0,
                v.round(),
            );
        }
        decade *= 10.0;
    }
    for &w in &workers {
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{}" stroke="#eee"/><text x="{x:.1}" y="{}" text-anchor="middle">{w}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 18.0,
            x = x(w),
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">concurrent workers (log scale)</text><text transform="translate(20 {}) rotate(-90)" text-anchor="middle">requests/s (log scale)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 15.0,
        TOP + plot_h / 2.0
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let dash = if s.bare {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let points: Vec<String> = s
            .points
            .iter()
            .map(|&(w, rps)| format!("{:.1},{:.1}", x(w), y(rps)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
            points.join(" ")
        );
        for &(w, rps) in &s.points {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                x(w),
                y(rps)
            );
        }
        let ly = TOP + 10.0 + i as f64 * 18.0;
        let lx = WIDTH - RIGHT + 20.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            escape(&s.label)
        );
    }
    out.push_str("</svg>\n");
    out
}

/// The power of ten at or below `v`.
fn decade_floor(v: f64) -> f64 {
    10f64.powf(v.max(1.0).log10().floor())
}

/// The power of ten at or above `v`.
fn decade_ceiling(v: f64) -> f64 {
    10f64.powf(v.max(1.0).log10().ceil())
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
