//! Lays out [`super`]'s charts with plotters' SVG backend: grouped and stacked horizontal bars
//! (names to the left, a value label at each bar's end), CDF lines on a log axis, and the
//! sweep on two y axes. Every figure and word comes from the caller; this file only places
//! them. Below each chart: its legend, then its notes.
//!
//! The SVG has no font metrics (plotters estimates text widths), so the layout leaves room
//! generously: names are wrapped, and bars end well before the right edge for their labels.

use std::ops::Range;

use anyhow::{anyhow, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::model::{BarGroup, Bars, Cdf, Stacked, StackedRow, Sweep, LATENCY_FLOOR_MS};
use crate::figures::int;

const WIDTH: u32 = 1200;
const FONT: &str = "sans-serif";
/// Room left of the bars for the group names.
const NAMES: u32 = 340;
/// Names longer than this (in characters) take two lines.
const NAME_CHARS: usize = 44;
const NOTE_LINE: u32 = 18;
const NOTE_CHARS: usize = 200;
const LEGEND_LINE: u32 = 24;

/// Okabe–Ito, safe for colour-blind readers; series take them in order.
const PALETTE: [RGBColor; 7] = [
    RGBColor(0x00, 0x72, 0xB2),
    RGBColor(0xE6, 0x9F, 0x00),
    RGBColor(0x00, 0x9E, 0x73),
    RGBColor(0xD5, 0x5E, 0x00),
    RGBColor(0xCC, 0x79, 0xA7),
    RGBColor(0x56, 0xB4, 0xE9),
    RGBColor(0x00, 0x00, 0x00),
];
const GREY: RGBColor = RGBColor(0x70, 0x70, 0x70);
const LIGHT: RGBColor = RGBColor(0xE4, 0xE4, 0xE4);

fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

fn text(size: u32, colour: RGBColor, h: HPos, v: VPos) -> TextStyle<'static> {
    TextStyle {
        font: (FONT, size).into_font(),
        color: colour.to_backend_color(),
        pos: Pos::new(h, v),
    }
}

/// plotters' errors carry the backend's, which borrows the output; keep the message.
fn failed<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("cannot draw the chart: {e}")
}

/// `line` cut into lines of at most `width` characters, at spaces.
fn wrap(line: &str, width: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut current = String::new();
    for word in line.split(' ') {
        if !current.is_empty() && current.chars().count() + 1 + word.chars().count() > width {
            out.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push(' ');
        }
        current.push_str(word);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// What a legend entry's swatch looks like.
#[derive(Clone, Copy)]
enum Swatch {
    Block,
    Line,
    Dashed,
    /// A bar's reference tick (chart 1).
    Tick,
}

/// The footer (legend, then notes): its height for `legend` entries and `notes`.
fn footer_height(legend: &[(String, RGBColor, Swatch)], notes: &[String]) -> u32 {
    let lines: usize = notes.iter().map(|n| wrap(n, NOTE_CHARS).len()).sum();
    legend_rows(legend).len() as u32 * LEGEND_LINE + lines as u32 * NOTE_LINE + 24
}

/// The legend's entries, laid out in rows that fit the width (an estimate: ~7 px a character).
fn legend_rows(legend: &[(String, RGBColor, Swatch)]) -> Vec<Vec<usize>> {
    let mut rows: Vec<Vec<usize>> = Vec::new();
    let mut used = 0;
    for (i, (label, _, _)) in legend.iter().enumerate() {
        let w = 40 + label.chars().count() as u32 * 7;
        match rows.last_mut() {
            Some(row) if used + w <= WIDTH - 60 => {
                row.push(i);
                used += w;
            }
            _ => {
                rows.push(vec![i]);
                used = w;
            }
        }
    }
    rows
}

fn draw_footer(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    legend: &[(String, RGBColor, Swatch)],
    notes: &[String],
) -> Result<()> {
    let mut y = 8;
    for row in legend_rows(legend) {
        let mut x = 30;
        for i in row {
            let (label, c, swatch) = &legend[i];
            let mid = y + LEGEND_LINE as i32 / 2;
            match swatch {
                Swatch::Block => area
                    .draw(&Rectangle::new(
                        [(x, mid - 6), (x + 22, mid + 6)],
                        c.filled(),
                    ))
                    .map_err(failed)?,
                Swatch::Line => area
                    .draw(&PathElement::new(
                        vec![(x, mid), (x + 22, mid)],
                        c.stroke_width(3),
                    ))
                    .map_err(failed)?,
                Swatch::Tick => area
                    .draw(&PathElement::new(
                        vec![(x + 11, mid - 9), (x + 11, mid + 9)],
                        c.stroke_width(2),
                    ))
                    .map_err(failed)?,
                Swatch::Dashed => {
                    for dash in [0, 9, 18] {
                        area.draw(&PathElement::new(
                            vec![(x + dash, mid), (x + dash + 5, mid)],
                            c.stroke_width(3),
                        ))
                        .map_err(failed)?;
                    }
                }
            }
            area.draw(&Text::new(
                label.clone(),
                (x + 30, mid),
                text(14, BLACK, HPos::Left, VPos::Center),
            ))
            .map_err(failed)?;
            x += 40 + label.chars().count() as i32 * 7;
        }
        y += LEGEND_LINE as i32;
    }
    y += 6;
    for note in notes {
        for line in wrap(note, NOTE_CHARS) {
            area.draw(&Text::new(
                line,
                (30, y + NOTE_LINE as i32 / 2),
                text(12, GREY, HPos::Left, VPos::Center),
            ))
            .map_err(failed)?;
            y += NOTE_LINE as i32;
        }
    }
    Ok(())
}

/// A long name in lines, broken after its last comma that leaves a first line short enough
/// (else at spaces).
fn name_lines(name: &str) -> Vec<String> {
    if name.chars().count() <= NAME_CHARS {
        return vec![name.to_string()];
    }
    let fits = name
        .match_indices(", ")
        .map(|(at, _)| at + 1)
        .filter(|&end| name[..end].chars().count() <= NAME_CHARS)
        .last();
    match fits {
        Some(end) if name[end..].trim().chars().count() <= NAME_CHARS => {
            vec![name[..end].to_string(), name[end..].trim().to_string()]
        }
        _ => wrap(name, NAME_CHARS),
    }
}

/// Draws `name` right-aligned at pixel `(x, y)` of `root`, on two lines if long.
fn draw_name(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    name: &str,
    (x, y): (i32, i32),
) -> Result<()> {
    let lines = name_lines(name);
    let first = y - 8 * (lines.len() as i32 - 1);
    for (i, line) in lines.into_iter().enumerate() {
        root.draw(&Text::new(
            line,
            (x, first + 16 * i as i32),
            text(14, BLACK, HPos::Right, VPos::Center),
        ))
        .map_err(failed)?;
    }
    Ok(())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// An SVG of `plot_h` pixels of chart, drawn by `plot` (given the whole canvas and the chart's
/// part of it), then the legend and the notes.
fn canvas(
    plot_h: u32,
    legend: &[(String, RGBColor, Swatch)],
    notes: &[String],
    plot: impl FnOnce(&Area<'_>, &Area<'_>) -> Result<()>,
) -> Result<String> {
    let height = plot_h + footer_height(legend, notes);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(failed)?;
        let (top, footer) = root.split_vertically(plot_h);
        plot(&root, &top)?;
        draw_footer(&footer, legend, notes)?;
        root.present().map_err(failed)?;
    }
    Ok(svg)
}

/// A legend of coloured blocks, one per name, in palette order.
fn blocks(names: &[String]) -> Vec<(String, RGBColor, Swatch)> {
    names
        .iter()
        .enumerate()
        .map(|(i, name)| (name.clone(), colour(i), Swatch::Block))
        .collect()
}

type Bars2d<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The axes of horizontal bars: `rows` rows from the top over `x`, room on the left for the
/// rows' names ([`draw_names`]), no y ticks.
fn bar_axes<'a, 'b>(
    top: &'a Area<'b>,
    title: &str,
    x: Range<f64>,
    rows: usize,
    x_desc: &str,
    x_label: &dyn Fn(&f64) -> String,
) -> Result<Bars2d<'a, 'b>> {
    let mut chart = ChartBuilder::on(top)
        .caption(title, (FONT, 22))
        .margin(10)
        .margin_right(30)
        .x_label_area_size(50)
        .y_label_area_size(NAMES)
        .build_cartesian_2d(x, 0.0..rows as f64)
        .map_err(failed)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_labels(10)
        .x_label_formatter(x_label)
        .x_desc(x_desc)
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .light_line_style(LIGHT)
        .x_max_light_lines(2)
        .y_max_light_lines(1)
        .draw()
        .map_err(failed)?;
    Ok(chart)
}

/// Each row's name left of its bars: row i from the top is y = rows - i - 1 .. rows - i.
fn draw_names<'n>(
    root: &Area<'_>,
    chart: &Bars2d<'_, '_>,
    names: impl ExactSizeIterator<Item = &'n str>,
) -> Result<()> {
    let rows = names.len() as f64;
    for (i, name) in names.enumerate() {
        let (px, py) = chart.backend_coord(&(0.0, rows - i as f64 - 0.5));
        draw_name(root, name, (px - 12, py))?;
    }
    Ok(())
}

/// A label of our own under the x axis, at pixel `(x, y)` of the axis: where plotters' ticks
/// would not fall on the values a reader looks for.
fn draw_x_label(root: &Area<'_>, (x, y): (i32, i32), label: String) -> Result<()> {
    root.draw(&Text::new(
        label,
        (x, y + 8),
        text(13, BLACK, HPos::Center, VPos::Top),
    ))
    .map_err(failed)
}

/// The x range of bars up to `max`, with room on the right for their labels.
fn bar_range(max: f64) -> Range<f64> {
    0.0..(max * 1.55).max(1.0)
}

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

/// The sweep (chart 4): x is log2 of the window, so powers of two are evenly spaced.
pub(super) fn sweep(s: &Sweep) -> Result<String> {
    let plot_h = 560;
    let swatches = [Swatch::Line, Swatch::Dashed, Swatch::Line, Swatch::Dashed];
    let colours = [colour(0), colour(6), colour(3), colour(4)];
    let legend: Vec<(String, RGBColor, Swatch)> = s
        .series
        .iter()
        .zip(colours.iter().zip(swatches))
        .map(|(name, (c, w))| (name.clone(), *c, w))
        .collect();
    let log2 = |w: u32| f64::from(w.max(1)).log2();
    let xs: Vec<f64> = s.points.iter().map(|p| log2(p.window)).collect();
    let x_lo = xs.iter().copied().fold(f64::MAX, f64::min) - 0.6;
    let x_hi = xs.iter().copied().fold(f64::MIN, f64::max) + 0.6;
    let rate_max = s
        .points
        .iter()
        .flat_map(|p| [Some(p.drain), p.broker])
        .flatten()
        .fold(0.0, f64::max);
    let dup_max = s
        .points
        .iter()
        .flat_map(|p| [p.duplicates, p.bound])
        .max()
        .unwrap_or(0) as f64;
    let y2_top = (dup_max * 1.2).max(10.0);
    canvas(plot_h, &legend, &s.notes, |root, top| {
        let mut chart = ChartBuilder::on(top)
            .caption(&s.title, (FONT, 22))
            .margin(10)
            .x_label_area_size(55)
            .y_label_area_size(90)
            .right_y_label_area_size(90)
            .build_cartesian_2d(x_lo..x_hi, 0.0..(rate_max * 1.2).max(1.0))
            .map_err(failed)?
            .set_secondary_coord(x_lo..x_hi, 0.0..y2_top);
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_labels(8)
            .y_label_formatter(&|v| int(*v))
            .x_desc(s.x_desc.as_str())
            .y_desc(s.y_desc.as_str())
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 15))
            .light_line_style(LIGHT)
            .x_max_light_lines(2)
            .y_max_light_lines(1)
            .draw()
            .map_err(failed)?;
        chart
            .configure_secondary_axes()
            .y_labels(8)
            .y_label_formatter(&|v| int(*v))
            .y_desc(s.y2_desc.as_str())
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 15))
            .draw()
            .map_err(failed)?;
        let drain: Vec<(f64, f64)> = s.points.iter().map(|p| (log2(p.window), p.drain)).collect();
        let broker: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter_map(|p| Some((log2(p.window), p.broker?)))
            .collect();
        let duplicates: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|p| (log2(p.window), p.duplicates as f64))
            .collect();
        let bound: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|p| (log2(p.window), p.bound as f64))
            .collect();
        // Lines first, then the markers with their figures (offset in pixels, off the line).
        chart
            .draw_series(LineSeries::new(drain.clone(), colours[0].stroke_width(3)))
            .map_err(failed)?;
        chart
            .draw_series(DashedLineSeries::new(
                broker.clone(),
                8,
                6,
                colours[1].stroke_width(2),
            ))
            .map_err(failed)?;
        chart
            .draw_secondary_series(LineSeries::new(
                duplicates.clone(),
                colours[2].stroke_width(3),
            ))
            .map_err(failed)?;
        chart
            .draw_secondary_series(DashedLineSeries::new(
                bound.clone(),
                8,
                6,
                colours[3].stroke_width(2),
            ))
            .map_err(failed)?;
        // A figure beside its marker: to the right (dx > 0) or the left, above (dy < 0) or below.
        let label = |figure: String, c: RGBColor, (dx, dy): (i32, i32)| {
            let h = if dx > 0 { HPos::Left } else { HPos::Right };
            Text::new(figure, (dx, dy), text(13, c, h, VPos::Center))
        };
        chart
            .draw_series(drain.iter().map(|&(x, y)| {
                EmptyElement::at((x, y))
                    + Circle::new((0, 0), 6, colours[0].filled())
                    + label(int(y), colours[0], (-8, 16))
            }))
            .map_err(failed)?;
        chart
            .draw_series(broker.iter().map(|&(x, y)| {
                EmptyElement::at((x, y))
                    + Circle::new((0, 0), 4, colours[1].filled())
                    + label(format!("broker alone {}", int(y)), colours[1], (-8, -14))
            }))
            .map_err(failed)?;
        chart
            .draw_secondary_series(duplicates.iter().map(|&(x, y)| {
                EmptyElement::at((x, y))
                    + TriangleMarker::new((0, 0), 8, colours[2].filled())
                    // Above the marker near the axis, where below would meet the x labels.
                    + label(int(y), colours[2], (8, if y < y2_top * 0.08 { -16 } else { 16 }))
            }))
            .map_err(failed)?;
        chart
            .draw_secondary_series(bound.iter().map(|&(x, y)| {
                EmptyElement::at((x, y))
                    + Circle::new((0, 0), 4, colours[3].filled())
                    + label(format!("bound {}", int(y)), colours[3], (8, -14))
            }))
            .map_err(failed)?;
        // The windows' own labels under the axis: the sweep's values, not rounded ticks.
        for p in &s.points {
            let at = chart.backend_coord(&(log2(p.window), 0.0));
            draw_x_label(root, at, int(f64::from(p.window)))?;
        }
        Ok(())
    })
}
