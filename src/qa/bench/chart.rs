//! `docs/bench.svg`: the pgbench sweeps against client count, and the
//! shop's purchases/s at its connection counts beside them.

use std::path::Path;

use super::*;

const XS: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 256];

pub fn chart(report: &BenchReport, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let no_sweep: &[Ceiling] = &[];
    let points = |key| {
        report
            .ceiling(key)
            .map_or(no_sweep, |s| s.points.as_slice())
    };
    let sweeps = [
        ("pgbench, one row, limit 1", points(PG_HOT_LIMIT_1), BLACK),
        (
            "pgbench, one row, no limit",
            points(PG_HOT_NO_LIMIT),
            RGBColor(90, 90, 90),
        ),
        (
            "pgbench, 100 rows, limit 1",
            points(PG_SPREAD_LIMIT_1),
            RGBColor(160, 160, 160),
        ),
    ];
    let shop: Vec<(&str, Option<&Measured>, RGBColor)> = vec![
        (
            "shop: hot product, limit 1 (median)",
            report.median(HOT_LIMIT_1),
            RED,
        ),
        (
            "shop: hot product, limit 2",
            report.find(HOT_LIMIT_2),
            MAGENTA,
        ),
        (
            "shop: hot product, no limit (64 and 256)",
            report.find(HOT_NO_LIMIT),
            GREEN,
        ),
        (
            "shop: 100 products, limit 1",
            report.find(SPREAD_LIMIT_1),
            BLUE,
        ),
    ];
    let x_of = |c: usize| XS.iter().position(|&x| x == c).map(|i| i as f64);
    let top = sweeps
        .iter()
        .flat_map(|(_, points, _)| points.iter().filter_map(|p| p.tps))
        .chain(
            report
                .runs
                .iter()
                .filter(|r| r.scenario != SELL_OUT)
                .map(Measured::orders_per_second),
        )
        .fold(1.0, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Purchases per second vs concurrent clients",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..XS.len() as f64 - 0.5, 0f64..top)?;
    // The client counts double: evenly spaced points read better than a linear axis.
    chart
        .configure_mesh()
        .x_desc("concurrent clients (pgbench) / connections (wrk)")
        .y_desc("purchases / s")
        .x_labels(XS.len())
        .x_label_formatter(&|x| {
            let i = x.round();
            match XS.get(i as usize) {
                Some(c) if (x - i).abs() < 1e-6 && i >= 0.0 => c.to_string(),
                _ => String::new(),
            }
        })
        .draw()?;
    for (label, points, color) in sweeps {
        let line: Vec<(f64, f64)> = points
            .iter()
            .filter_map(|p| Some((x_of(p.clients)?, p.tps?)))
            .collect();
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(line.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    for (label, run, color) in shop {
        let mut points: Vec<(f64, f64)> = run
            .into_iter()
            .filter_map(|r| Some((x_of(r.connections)?, r.orders_per_second())))
            .collect();
        if label.starts_with("shop: hot product, no limit") {
            points.extend(
                report
                    .find(HOT_256)
                    .and_then(|r| Some((x_of(r.connections)?, r.orders_per_second()))),
            );
        }
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 6, color.filled())),
            )?
            .label(label)
            .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
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
