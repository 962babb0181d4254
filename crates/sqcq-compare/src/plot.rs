//! A grouped bar chart of IOPS per mode, relative to the baseline, as SVG.

use std::fmt::Write as _;

use crate::matrix::{Outcome, Plan};
use crate::report::{self, Machine};

const COLORS: [&str; 6] = [
    "#7f7f7f", "#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#ff7f0e",
];

/// The chart: one group of bars per cell, one bar per mode, height = IOPS
/// divided by the baseline mode's IOPS in that cell, on a log scale so
/// that 0.5x and 2x are equally far from 1x.
pub fn iops_svg(plan: &Plan, results: &[Outcome], machine: &Machine) -> String {
    let cells = plan.cells();
    let (bar, gap, left, top, height) = (14.0, 18.0, 60.0, 50.0, 300.0);
    let group = bar * plan.modes.len() as f64 + gap;
    let legend = left + 110.0 * plan.modes.len() as f64 + 20.0;
    let width = (left + group * cells.len() as f64 + 20.0)
        .max(legend)
        .max(560.0);
    let ratios: Vec<Vec<Option<f64>>> = cells
        .iter()
        .map(|cell| {
            let iops = |m: &str| {
                report::find(results, cell, m)
                    .and_then(|o| o.median.as_ref())
                    .map(|f| f.iops)
            };
            let base = iops(&plan.modes[0]).filter(|b| *b > 0.0);
            plan.modes
                .iter()
                .map(|m| Some(iops(m)? / base?).filter(|r| *r > 0.0))
                .collect()
        })
        .collect();
    let max = ratios
        .iter()
        .flatten()
        .flatten()
        .fold(2.0_f64, |a, &b| a.max(b));
    let min = ratios
        .iter()
        .flatten()
        .flatten()
        .fold(0.5_f64, |a, &b| a.min(b));
    let (lo, hi) = (min.log10(), max.log10());
    let y = |r: f64| top + height * (hi - r.log10()) / (hi - lo);

    let mut s = String::new();
    let total_height = top + height + 110.0;
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{total_height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<text x="{left}" y="18" font-size="14">IOPS relative to {} (log scale), {} CPU(s), load {}</text>"#,
        plan.modes[0],
        machine.cpus,
        machine
            .load_average
            .split_whitespace()
            .next()
            .unwrap_or("?")
    );
    for tick in [0.25, 0.5, 1.0, 2.0, 4.0, 10.0, 20.0, 50.0, 100.0] {
        if tick >= min && tick <= max {
            let ty = y(tick);
            let dash = if (tick - 1.0).abs() < f64::EPSILON {
                ""
            } else {
                r#" stroke-dasharray="2,3""#
            };
            let _ = write!(
                s,
                r##"<line x1="{left}" x2="{width:.0}" y1="{ty:.1}" y2="{ty:.1}" stroke="#999"{dash}/><text x="{:.0}" y="{:.1}" text-anchor="end">{tick}x</text>"##,
                left - 4.0,
                ty + 4.0
            );
        }
    }
    for (c, (cell, row)) in cells.iter().zip(&ratios).enumerate() {
        let gx = left + group * c as f64;
        for (m, ratio) in row.iter().enumerate() {
            let Some(r) = ratio else { continue };
            let (y0, y1) = (y(1.0), y(*r));
            let (top_y, h) = if y1 < y0 {
                (y1, y0 - y1)
            } else {
                (y0, y1 - y0)
            };
            let _ = write!(
                s,
                r#"<rect x="{:.1}" y="{top_y:.1}" width="{bar}" height="{h:.1}" fill="{}"><title>{} {}: {r:.2}x</title></rect>"#,
                gx + bar * m as f64,
                COLORS[m % COLORS.len()],
                plan.modes[m],
                cell.label()
            );
        }
        let lx = gx + group / 2.0 - gap / 2.0;
        let ly = top + height + 12.0;
        let short = if cell.rw.contains("write") { "W" } else { "R" };
        let peer = if cell.target == "sqcqd" { "" } else { "peer " };
        let device = if cell.device == "scsi" { "" } else { "blk " };
        let _ = write!(
            s,
            r#"<text x="{lx:.1}" y="{ly:.1}" transform="rotate(45 {lx:.1} {ly:.1})">{peer}{device}{short} QD{} NJ{}</text>"#,
            cell.qd, cell.jobs
        );
    }
    for (m, mode) in plan.modes.iter().enumerate() {
        let lx = left + 110.0 * m as f64;
        let ly = total_height - 12.0;
        let _ = write!(
            s,
            r#"<rect x="{lx:.0}" y="{:.0}" width="10" height="10" fill="{}"/><text x="{:.0}" y="{ly:.0}">{mode}</text>"#,
            ly - 9.0,
            COLORS[m % COLORS.len()],
            lx + 14.0
        );
    }
    s.push_str("</svg>\n");
    s
}
