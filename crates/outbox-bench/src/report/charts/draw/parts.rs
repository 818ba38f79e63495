//! The pieces every chart of [`super`] is drawn with: the page's sizes, fonts and colours,
//! wrapped names, the legend and notes below a chart, and the axes of a bar chart.

use std::ops::Range;

use anyhow::{anyhow, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const WIDTH: u32 = 1200;
pub(super) const FONT: &str = "sans-serif";
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
pub(super) const LIGHT: RGBColor = RGBColor(0xE4, 0xE4, 0xE4);

pub(super) fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

pub(super) fn text(size: u32, colour: RGBColor, h: HPos, v: VPos) -> TextStyle<'static> {
    TextStyle {
        font: (FONT, size).into_font(),
        color: colour.to_backend_color(),
        pos: Pos::new(h, v),
    }
}

/// plotters' errors carry the backend's, which borrows the output; keep the message.
pub(super) fn failed<E: std::fmt::Display>(e: E) -> anyhow::Error {
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
pub(super) enum Swatch {
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
pub(super) fn canvas(
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
pub(super) fn blocks(names: &[String]) -> Vec<(String, RGBColor, Swatch)> {
    names
        .iter()
        .enumerate()
        .map(|(i, name)| (name.clone(), colour(i), Swatch::Block))
        .collect()
}

type Bars2d<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The axes of horizontal bars: `rows` rows from the top over `x`, room on the left for the
/// rows' names ([`draw_names`]), no y ticks.
pub(super) fn bar_axes<'a, 'b>(
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
pub(super) fn draw_names<'n>(
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
pub(super) fn draw_x_label(root: &Area<'_>, (x, y): (i32, i32), label: String) -> Result<()> {
    root.draw(&Text::new(
        label,
        (x, y + 8),
        text(13, BLACK, HPos::Center, VPos::Top),
    ))
    .map_err(failed)
}

/// The x range of bars up to `max`, with room on the right for their labels.
pub(super) fn bar_range(max: f64) -> Range<f64> {
    0.0..(max * 1.55).max(1.0)
}
