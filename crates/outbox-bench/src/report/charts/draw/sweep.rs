//! The sweep (chart 4), drawn from the shared pieces of [`super`].

use anyhow::Result;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use super::parts::{canvas, colour, draw_x_label, failed, text, Swatch, FONT, LIGHT};
use crate::measurement::figures::int;
use crate::report::charts::model::Sweep;

/// The sweep (chart 4): x is log2 of the window, so powers of two are evenly spaced.
pub(crate) fn sweep(s: &Sweep) -> Result<String> {
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
