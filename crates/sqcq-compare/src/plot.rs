//! The charts, as SVG: a grouped bar chart of IOPS per mode relative to
//! the baseline mode, and IOPS against sqcqd's worker count.

use std::fmt::Write as _;

use crate::format::thousands;
use crate::machine::Machine;
use crate::matrix::{Outcome, Plan, find};
use crate::run::Cell;
use crate::scaling::Series;

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
                find(results, cell, m)
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
        r#"<text x="{left}" y="18" font-size="14">IOPS relative to {} (log scale), {} CPU(s), load {} at the start</text>"#,
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
        let devices = if cell.device_count > 1 {
            format!(" D{}", cell.device_count)
        } else {
            String::new()
        };
        let workers = match cell.workers {
            Some(w) if w != 1 => format!(" W{w}"),
            _ => String::new(),
        };
        let _ = write!(
            s,
            r#"<text x="{lx:.1}" y="{ly:.1}" transform="rotate(45 {lx:.1} {ly:.1})">{peer}{device}{short} QD{} NJ{}{devices}{workers}</text>"#,
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

/// A tick step for an axis from 0 to `max` with at most eight ticks.
fn tick_step(max: f64) -> f64 {
    [0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0]
        .into_iter()
        .find(|step| max / step <= 8.0)
        .unwrap_or(100.0)
}

/// `v` with at most two decimals and no trailing zeros: 0.3, 1, 1.25.
fn tick_label(v: f64) -> String {
    let text = format!("{v:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The workers chart: a panel per group of the workers axis, a line per
/// mode of its IOPS relative to its own IOPS at the first worker count,
/// against sqcqd's worker count; a dashed line marks linear scaling (the
/// seed's claim while CPUs last).
pub fn workers_svg(plan: &Plan, series: &[Series], machine: &Machine) -> String {
    let (left, top, plot_w, plot_h, panel_gap) = (60.0, 50.0, 480.0, 260.0, 70.0);
    let mut groups: Vec<&Cell> = series.iter().map(|s| &s.cell).collect();
    groups.dedup();
    let first = f64::from(plan.workers.first().copied().unwrap_or(1));
    let ideal = |w: u16| f64::from(w) / first;
    let max = series
        .iter()
        .flat_map(|s| s.points.iter().filter_map(|p| p.ratio))
        .chain(plan.workers.iter().map(|&w| ideal(w)))
        .fold(1.2_f64, f64::max)
        * 1.1;
    let step = tick_step(max);
    let n = plan.workers.len().max(2);
    let x = |i: usize| left + 20.0 + (plot_w - 40.0) * i as f64 / (n - 1) as f64;
    let width = left + plot_w + 130.0;
    let panel = plot_h + panel_gap;
    let total_height = top + panel * groups.len() as f64 + 10.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{total_height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<text x="{left}" y="18" font-size="14">IOPS vs sqcqd workers, relative to W{first}, {} CPU(s), load {} at the start</text>"#,
        machine.cpus,
        machine
            .load_average
            .split_whitespace()
            .next()
            .unwrap_or("?")
    );
    for (g, cell) in groups.iter().enumerate() {
        let py = top + panel * g as f64;
        let y = |r: f64| py + plot_h * (1.0 - r / max);
        let _ = write!(
            s,
            r#"<text x="{left}" y="{:.0}" font-size="12">{} ({} device(s) x {} queue(s))</text>"#,
            py - 8.0,
            cell.label(),
            cell.device_count,
            cell.queues
        );
        let ticks = (0_u32..).map(|k| f64::from(k) * step);
        for tick in ticks.take_while(|t| *t <= max) {
            let ty = y(tick);
            let dash = if (tick - 1.0).abs() < 1e-9 {
                ""
            } else {
                r#" stroke-dasharray="2,3""#
            };
            let _ = write!(
                s,
                r##"<line x1="{left}" x2="{:.0}" y1="{ty:.1}" y2="{ty:.1}" stroke="#bbb"{dash}/><text x="{:.0}" y="{:.1}" text-anchor="end">{}x</text>"##,
                left + plot_w,
                left - 4.0,
                ty + 4.0,
                tick_label(tick)
            );
        }
        for (i, w) in plan.workers.iter().enumerate() {
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">W{w}</text>"#,
                x(i),
                py + plot_h + 16.0
            );
        }
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">sqcqd worker threads</text>"#,
            left + plot_w / 2.0,
            py + plot_h + 34.0
        );
        let ideal_points: Vec<String> = plan
            .workers
            .iter()
            .enumerate()
            .map(|(i, &w)| format!("{:.1},{:.1}", x(i), y(ideal(w))))
            .collect();
        let _ = write!(
            s,
            r##"<polyline points="{}" fill="none" stroke="#999" stroke-dasharray="6,4"><title>linear scaling</title></polyline>"##,
            ideal_points.join(" ")
        );
        for (m, mode) in plan.modes.iter().enumerate() {
            let Some(line) = series.iter().find(|s| s.cell == **cell && s.mode == *mode) else {
                continue;
            };
            let color = COLORS[m % COLORS.len()];
            let mut points = Vec::new();
            for (i, &w) in plan.workers.iter().enumerate() {
                let Some(p) = line.at(w) else { continue };
                let Some(r) = p.ratio else { continue };
                let (px, ry) = (x(i), y(r));
                points.push(format!("{px:.1},{ry:.1}"));
                let _ = write!(
                    s,
                    r#"<circle cx="{px:.1}" cy="{ry:.1}" r="3.5" fill="{color}"><title>{mode} W{w}: {} IOPS, {r:.2}x</title></circle>"#,
                    thousands(p.iops)
                );
            }
            let _ = write!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
                points.join(" ")
            );
        }
        for (m, mode) in plan.modes.iter().enumerate() {
            let ly = py + 14.0 + 16.0 * m as f64;
            let lx = left + plot_w + 14.0;
            let _ = write!(
                s,
                r#"<rect x="{lx:.0}" y="{:.0}" width="10" height="10" fill="{}"/><text x="{:.0}" y="{ly:.0}">{mode}</text>"#,
                ly - 9.0,
                COLORS[m % COLORS.len()],
                lx + 14.0
            );
        }
        let ly = py + 14.0 + 16.0 * plan.modes.len() as f64;
        let _ = write!(
            s,
            r##"<line x1="{:.0}" x2="{:.0}" y1="{:.0}" y2="{:.0}" stroke="#999" stroke-dasharray="6,4"/><text x="{:.0}" y="{ly:.0}">linear</text>"##,
            left + plot_w + 14.0,
            left + plot_w + 24.0,
            ly - 4.0,
            ly - 4.0,
            left + plot_w + 28.0
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scaling::Point;

    fn point(workers: u16, ratio: f64) -> Point {
        Point {
            workers,
            iops: 1000.0 * ratio,
            ratio: Some(ratio),
            driver_cpu_us: 1.0,
            target_cpu_us: 1.0,
            kicks_calls_per_io: 0.1,
            workers_seen: Some(u32::from(workers)),
            worker_busy: vec![],
            mode_run: "notify".into(),
        }
    }

    #[test]
    fn workers_chart_has_a_line_per_mode_and_the_linear_reference() {
        let plan = Plan {
            modes: vec!["notify".into(), "sqcq".into()],
            workers: vec![1, 2],
            ..crate::matrix::tests::plan()
        };
        let cell = plan.groups()[0][0].with_workers(None);
        let series = vec![
            Series {
                cell: cell.clone(),
                mode: "notify".into(),
                points: vec![point(1, 1.0), point(2, 1.5)],
            },
            Series {
                cell,
                mode: "sqcq".into(),
                points: vec![point(1, 1.0)],
            },
        ];
        let machine = Machine {
            cpu: "x".into(),
            cpus: 2,
            kernel: "k".into(),
            load_average: "0.5 0.4 0.3".into(),
            load_average_end: None,
        };
        let svg = workers_svg(&plan, &series, &machine);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(
            svg.contains("IOPS vs sqcqd workers, relative to W1, 2 CPU(s), load 0.5 at the start")
        );
        assert!(
            svg.contains("<title>notify W2: 1,500 IOPS, 1.50x</title>"),
            "{svg}"
        );
        assert!(svg.contains("<title>linear scaling</title>"));
        // Three points: notify's two, sqcq's one (its W2 failed).
        assert_eq!(svg.matches("<circle").count(), 3);
        assert!(svg.contains(">W1</text>") && svg.contains(">W2</text>"));
    }

    #[test]
    fn bar_labels_name_devices_and_workers() {
        let plan = Plan {
            jobs: vec![2],
            device_count: 2,
            workers: vec![1, 2],
            ..crate::matrix::tests::plan()
        };
        let machine = Machine {
            cpu: "x".into(),
            cpus: 2,
            kernel: "k".into(),
            load_average: "0".into(),
            load_average_end: None,
        };
        let svg = iops_svg(&plan, &[], &machine);
        assert!(svg.contains(">R QD1 NJ2 D2</text>"), "{svg}");
        assert!(svg.contains(">R QD1 NJ2 D2 W2</text>"), "{svg}");
    }

    #[test]
    fn ticks_stay_few() {
        assert_eq!(tick_step(1.3), 0.2);
        assert_eq!(tick_step(2.2), 0.5);
        assert_eq!(tick_step(30.0), 5.0);
        assert_eq!(tick_label(3.0 * 0.1), "0.3");
        assert_eq!(tick_label(2.0), "2");
        assert_eq!(tick_label(1.25), "1.25");
    }
}
