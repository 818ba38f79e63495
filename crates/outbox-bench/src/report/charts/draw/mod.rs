//! Lays out [`super`]'s charts with plotters' SVG backend: grouped and stacked horizontal bars
//! (names to the left, a value label at each bar's end), CDF lines on a log axis, and the
//! sweep on two y axes. Every figure and word comes from the caller; this file only places
//! them. Below each chart: its legend, then its notes.
//!
//! The SVG has no font metrics (plotters estimates text widths), so the layout leaves room
//! generously: names are wrapped, and bars end well before the right edge for their labels.

use std::ops::Range;

use anyhow::Result;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use super::model::{BarGroup, Bars, Cdf, Stacked, StackedRow, LATENCY_FLOOR_MS};
use crate::measurement::figures::int;

mod parts;
mod sweep;

use parts::{
    bar_axes, bar_range, blocks, canvas, colour, draw_names, draw_x_label, failed, text, Swatch,
    FONT, LIGHT,
};

pub(super) use sweep::sweep;

/// Grouped horizontal bars (chart 1).
pub(super) fn bars(b: &Bars) -> Result<String> {
    let per_bar = 20u32;
    let group_h = per_bar * b.series.len() as u32 + 22;
    let plot_h = 70 + group_h * b.groups.len() as u32 + 55;
    let mut legend = blocks(&b.series);
    let bars = || b.groups.iter().flat_map(|g| g.bars.iter().flatten());
    if bars().any(|bar| bar.reference.is_some()) {
        legend.push((b.reference_desc.clone(), BLACK, Swatch::Tick));
    }
    canvas(plot_h, &legend, &b.notes, |root, top| {
        let n = b.groups.len() as f64;
        let max = bars()
            .map(|bar| bar.value.max(bar.reference.unwrap_or(0.0)))
            .fold(0.0, f64::max);
        let x = bar_range(max);
        let mut chart = bar_axes(top, &b.title, x.clone(), b.groups.len(), &b.x_desc, &|v| {
            int(*v)
        })?;
        // Group i from the top spans y = n - i - 1 .. n - i. Its bars (those it has, in series
        // order) are centred in it, one slot each.
        let k = b.series.len().max(1) as f64;
        let slot = 0.76 / k;
        let bar_y = |i: usize, g: &BarGroup, j: usize| {
            let present = g.bars.iter().filter(|b| b.is_some()).count() as f64;
            let rank = g.bars[..j].iter().filter(|b| b.is_some()).count() as f64;
            let top = n - i as f64 - 0.5 + slot * present / 2.0 - slot * rank;
            (top - slot * 0.9, top)
        };
        let gap = x.end * 0.008;
        for j in 0..b.series.len() {
            chart
                .draw_series(b.groups.iter().enumerate().filter_map(|(i, g)| {
                    let bar = g.bars.get(j)?.as_ref()?;
                    let (y0, y1) = bar_y(i, g, j);
                    Some(Rectangle::new(
                        [(0.0, y0), (bar.value, y1)],
                        colour(j).filled(),
                    ))
                }))
                .map_err(failed)?;
            // The tick a little past the bar's edges, so it shows where the bar ends short.
            chart
                .draw_series(b.groups.iter().enumerate().filter_map(|(i, g)| {
                    let bar = g.bars.get(j)?.as_ref()?;
                    let reference = bar.reference?;
                    let (y0, y1) = bar_y(i, g, j);
                    let over = slot * 0.12;
                    Some(PathElement::new(
                        vec![(reference, y0 - over), (reference, y1 + over)],
                        BLACK.stroke_width(2),
                    ))
                }))
                .map_err(failed)?;
            chart
                .draw_series(b.groups.iter().enumerate().filter_map(|(i, g)| {
                    let bar = g.bars.get(j)?.as_ref()?;
                    let (y0, y1) = bar_y(i, g, j);
                    // Past the tick too, which would cross the text.
                    let end = bar.value.max(bar.reference.unwrap_or(0.0));
                    Some(Text::new(
                        bar.label.clone(),
                        (end + gap, (y0 + y1) / 2.0),
                        text(13, BLACK, HPos::Left, VPos::Center),
                    ))
                }))
                .map_err(failed)?;
        }
        draw_names(root, &chart, b.groups.iter().map(|g| g.name.as_str()))?;
        Ok(())
    })
}

/// Stacked horizontal bars (chart 3).
pub(super) fn stacked(s: &Stacked) -> Result<String> {
    let row_h = 34u32;
    let plot_h = 70 + row_h * s.rows.len() as u32 + 55;
    let legend = blocks(&s.parts);
    canvas(plot_h, &legend, &s.notes, |root, top| {
        let n = s.rows.len() as f64;
        let total = |r: &StackedRow| r.parts.iter().flatten().sum::<f64>();
        let max = s.rows.iter().map(total).fold(0.0, f64::max);
        let x = 0.0..(max * 1.2).max(1.0);
        let mut chart = bar_axes(top, &s.title, x.clone(), s.rows.len(), &s.x_desc, &|v| {
            format!("{v:.0}")
        })?;
        let row_y = |i: usize| (n - i as f64 - 0.85, n - i as f64 - 0.15);
        for part in 0..s.parts.len() {
            chart
                .draw_series(s.rows.iter().enumerate().filter_map(|(i, r)| {
                    let value = (*r.parts.get(part)?)?;
                    let start: f64 = r.parts[..part].iter().flatten().sum();
                    let (y0, y1) = row_y(i);
                    Some(Rectangle::new(
                        [(start, y0), (start + value, y1)],
                        colour(part).filled(),
                    ))
                }))
                .map_err(failed)?;
        }
        // Each segment's figure inside it where it fits, the sum at the end.
        chart
            .draw_series(s.rows.iter().enumerate().flat_map(|(i, r)| {
                let (y0, y1) = row_y(i);
                let mid = (y0 + y1) / 2.0;
                let mut start = 0.0;
                let mut labels = Vec::new();
                for value in r.parts.iter().flatten() {
                    if *value >= max * 0.07 {
                        labels.push(Text::new(
                            format!("{value:.1}"),
                            (start + value / 2.0, mid),
                            text(12, WHITE, HPos::Center, VPos::Center),
                        ));
                    }
                    start += value;
                }
                labels.push(Text::new(
                    format!("{:.1} µs", total(r)),
                    (start + x.end * 0.008, mid),
                    text(13, BLACK, HPos::Left, VPos::Center),
                ));
                labels
            }))
            .map_err(failed)?;
        draw_names(root, &chart, s.rows.iter().map(|r| r.name.as_str()))?;
        Ok(())
    })
}

/// The log axis of a CDF over `points`: a little room either side.
fn latency_range(c: &Cdf) -> Range<f64> {
    let values = c.curves.iter().flat_map(|k| k.points.iter().map(|p| p.0));
    let (lo, hi) = values.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let lo = (lo / 1.5).max(LATENCY_FLOOR_MS);
    let hi = (hi * 1.5).max(lo * 10.0);
    lo..hi
}

/// 1, 2 and 5 times each power of ten inside `range`: where a log axis is read.
fn decade_ticks(range: &Range<f64>) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut power = range.start.log10().floor() as i32;
    while 10f64.powi(power) <= range.end {
        for m in [1.0, 2.0, 5.0] {
            let tick = m * 10f64.powi(power);
            if range.contains(&tick) {
                ticks.push(tick);
            }
        }
        power += 1;
    }
    ticks
}

/// "0.5 ms", "2 ms", "100 ms": a tick's value without trailing zeros.
fn tick_label(ms: f64) -> String {
    let digits = format!("{ms:.3}");
    format!("{} ms", digits.trim_end_matches('0').trim_end_matches('.'))
}

/// Cumulative distributions (chart 2).
pub(super) fn cdf(c: &Cdf) -> Result<String> {
    let plot_h = 620;
    let legend: Vec<(String, RGBColor, Swatch)> = c
        .curves
        .iter()
        .map(|k| {
            let swatch = if k.coarse {
                Swatch::Dashed
            } else {
                Swatch::Line
            };
            (k.name.clone(), colour(k.colour), swatch)
        })
        .collect();
    canvas(plot_h, &legend, &c.notes, |root, top| {
        let range = latency_range(c);
        let mut chart = ChartBuilder::on(top)
            .caption(&c.title, (FONT, 22))
            .margin(10)
            .margin_right(40)
            .x_label_area_size(55)
            .y_label_area_size(80)
            .build_cartesian_2d(range.clone().log_scale(), 0.0..104.0)
            .map_err(failed)?;
        // The ticks' own labels are drawn below, at 1, 2 and 5 of each decade.
        chart
            .configure_mesh()
            .x_labels(12)
            .y_labels(14)
            .x_label_formatter(&|_| String::new())
            .y_label_formatter(&|v| format!("{v:.0} %"))
            .x_desc(c.x_desc.as_str())
            .y_desc(c.y_desc.as_str())
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 15))
            .light_line_style(LIGHT)
            .x_max_light_lines(2)
            .y_max_light_lines(1)
            .draw()
            .map_err(failed)?;
        for tick in decade_ticks(&range) {
            draw_x_label(root, chart.backend_coord(&(tick, 0.0)), tick_label(tick))?;
        }
        for k in &c.curves {
            let c = colour(k.colour);
            let points: Vec<(f64, f64)> = k
                .points
                .iter()
                .map(|&(x, q)| (x.max(range.start), q * 100.0))
                .collect();
            if k.coarse {
                chart
                    .draw_series(DashedLineSeries::new(
                        points.clone(),
                        8,
                        6,
                        c.stroke_width(2),
                    ))
                    .map_err(failed)?;
                chart
                    .draw_series(points.iter().map(|&p| Circle::new(p, 5, c.filled())))
                    .map_err(failed)?;
            } else {
                chart
                    .draw_series(LineSeries::new(points, c.stroke_width(2)))
                    .map_err(failed)?;
            }
        }
        Ok(())
    })
}
