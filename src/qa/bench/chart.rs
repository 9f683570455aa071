//! `docs/bench.svg`: purchases per second against concurrent buyers.

use std::path::Path;

use super::*;

pub fn chart(report: &BenchReport, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let series = [
        (HOT, RED),
        (HOT_ONE_BY_ONE, MAGENTA),
        (SPREAD, BLUE),
        (PGBENCH, BLACK),
    ];
    let top = report
        .points
        .iter()
        .filter(|p| series.iter().any(|(s, _)| *s == p.scenario))
        .map(|p| p.per_second)
        .fold(1.0, f64::max)
        * 1.15;
    let xs: Vec<usize> = {
        let mut xs: Vec<usize> = report
            .points
            .iter()
            .filter(|p| p.scenario == HOT)
            .map(|p| p.concurrency)
            .collect();
        xs.sort_unstable();
        xs
    };
    // The concurrency steps grow by 4x to 16x: evenly spaced points read better than a linear axis.
    let x_of = |c: usize| xs.iter().position(|&x| x == c).unwrap_or(0) as f64;
    let x_max = xs.len().max(1) as f64 - 0.5;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Purchases per second vs concurrent buyers",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..x_max, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("concurrent buyers")
        .y_desc("purchases / s")
        .x_labels(xs.len().max(2))
        .x_label_formatter(&|x| {
            let i = x.round();
            match xs.get(i as usize) {
                Some(c) if (x - i).abs() < 1e-6 && i >= 0.0 => c.to_string(),
                _ => String::new(),
            }
        })
        .draw()?;
    for (scenario, color) in series {
        let points: Vec<(f64, f64)> = xs
            .iter()
            .filter_map(|&c| report.find(scenario, c).map(|p| (x_of(c), p.per_second)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(scenario)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
