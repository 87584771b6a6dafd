//! The picture: latency distributions as box plots on a log scale, drawn with plotters (SVG).
//!
//! Each box spans p25 to p75, with a bar at p50 and whiskers from p5 to p95; a dot marks p99.

use std::path::Path;

use plotters::prelude::*;

use crate::stats::Samples;

/// One box: a label under it, its samples, and whether it is the baseline of its pair.
pub struct Series<'a> {
    pub group: &'a str,
    pub label: &'a str,
    pub samples: &'a Samples,
    pub baseline: bool,
}

const COMPONENT: RGBColor = RGBColor(31, 119, 180);
const BASELINE: RGBColor = RGBColor(255, 127, 14);

pub fn latency(path: &Path, title: &str, series: &[Series<'_>]) -> Result<(), String> {
    let lowest = series
        .iter()
        .map(|s| s.samples.quantile(0.0))
        .fold(f64::INFINITY, f64::min)
        .max(0.01);
    let highest = series
        .iter()
        .map(|s| s.samples.quantile(1.0))
        .fold(0.0, f64::max);
    let root = SVGBackend::new(path, (1100, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let count = series.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(70)
        .y_label_area_size(70)
        .build_cartesian_2d(
            -0.5f64..count as f64 - 0.5,
            (lowest * 0.8..highest * 1.25).log_scale(),
        )
        .map_err(|e| e.to_string())?;
    let labels: Vec<String> = series
        .iter()
        .map(|s| format!("{}\n{}", s.group, s.label))
        .collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(count)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 && (i as usize) < labels.len() {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_desc("latency, ms (log scale)")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, s) in series.iter().enumerate() {
        let x = i as f64;
        let color = if s.baseline { BASELINE } else { COMPONENT };
        let q = |p| s.samples.quantile(p);
        let w = 0.3;
        chart
            .draw_series([
                PathElement::new(vec![(x, q(0.05)), (x, q(0.25))], color.stroke_width(2)),
                PathElement::new(vec![(x, q(0.75)), (x, q(0.95))], color.stroke_width(2)),
                PathElement::new(
                    vec![(x - w, q(0.5)), (x + w, q(0.5))],
                    BLACK.stroke_width(3),
                ),
            ])
            .map_err(|e| e.to_string())?;
        chart
            .draw_series([Rectangle::new(
                [(x - w, q(0.25)), (x + w, q(0.75))],
                color.mix(0.35).filled(),
            )])
            .map_err(|e| e.to_string())?;
        chart
            .draw_series([Circle::new((x, q(0.99)), 4, color.filled())])
            .map_err(|e| e.to_string())?;
    }
    // The legend, by hand: two swatches.
    for (row, (name, color)) in [
        ("through the component", COMPONENT),
        ("baseline (raw HTTP / fenced lock)", BASELINE),
    ]
    .into_iter()
    .enumerate()
    {
        let y = 40 + row as i32 * 20;
        root.draw(&Rectangle::new([(100, y), (114, y + 12)], color.filled()))
            .map_err(|e| e.to_string())?;
        root.draw(&Text::new(name, (120, y), ("sans-serif", 13)))
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}
