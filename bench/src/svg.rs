//! A small SVG line plot: one line per agent over time, the threshold as a dashed line, and a marker where each
//! agent's action landed (SIGTERM sent, or the kernel's OOM kill).

use std::fmt::Write;

/// One line of the plot.
pub struct Line {
    /// The legend.
    pub label: String,
    /// (seconds, value) points.
    pub points: Vec<(f64, f64)>,
    /// Times of the agent's actions.
    pub markers: Vec<f64>,
}

const COLORS: [&str; 4] = ["#d62728", "#ff7f0e", "#7f7f7f", "#1f77b4"];
const W: f64 = 860.0;
const H: f64 = 420.0;
/// Margins: left, right (the legend), top, bottom.
const L: f64 = 70.0;
const R: f64 = 200.0;
const T: f64 = 40.0;
const B: f64 = 50.0;

fn value_at(points: &[(f64, f64)], t: f64) -> f64 {
    points.iter().rev().find(|(x, _)| *x <= t).or(points.first()).map_or(0.0, |p| p.1)
}

/// Renders the plot; `x_max` bounds the time axis.
pub fn plot(title: &str, y_label: &str, threshold: f64, lines: &[Line], x_max: f64) -> String {
    let x_min = -1.0;
    let y_max = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)).fold(threshold * 1.2, f64::max).max(1.0);
    let px = |x: f64| L + (x.clamp(x_min, x_max) - x_min) / (x_max - x_min) * (W - L - R);
    let py = |y: f64| H - B - (y / y_max).clamp(0.0, 1.0) * (H - T - B);
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">{title}</text>\n",
        (W - R + L) / 2.0
    );
    // Axes and ticks.
    let _ = writeln!(
        s,
        "<line x1=\"{L}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/><line x1=\"{L}\" y1=\"{T}\" x2=\"{L}\" y2=\"{}\" stroke=\"black\"/>",
        H - B,
        W - R,
        H - B,
        H - B
    );
    let step = ((x_max - x_min) / 10.0).ceil().max(1.0);
    let mut x = 0.0;
    while x <= x_max {
        let _ = writeln!(s, "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{x:.0}</text>", px(x), H - B + 16.0);
        x += step;
    }
    for i in 0..=4 {
        let y = y_max * f64::from(i) / 4.0;
        let _ = writeln!(s, "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{y:.0}</text>", L - 6.0, py(y) + 4.0);
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">seconds since the workload started</text>\n\
         <text x=\"16\" y=\"{:.1}\" transform=\"rotate(-90 16 {:.1})\" text-anchor=\"middle\">{y_label}</text>",
        (W - R + L) / 2.0,
        H - 12.0,
        (H - B + T) / 2.0,
        (H - B + T) / 2.0
    );
    let _ = writeln!(
        s,
        "<line x1=\"{L}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"black\" stroke-dasharray=\"6 4\"/>\
         <text x=\"{2}\" y=\"{0:.1}\">threshold</text>",
        py(threshold),
        W - R,
        W - R + 6.0
    );
    for (i, line) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let stride = (line.points.len() / 1500).max(1);
        let pts: Vec<String> = line
            .points
            .iter()
            .step_by(stride)
            .filter(|(x, _)| *x >= x_min && *x <= x_max)
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>",
            pts.join(" ")
        );
        for m in line.markers.iter().filter(|m| **m <= x_max) {
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"5\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"/>",
                px(*m),
                py(value_at(&line.points, *m))
            );
        }
        let ly = T + 20.0 + 20.0 * f64::from(u32::try_from(i).unwrap_or(0));
        let _ = writeln!(
            s,
            "<line x1=\"{0}\" y1=\"{ly}\" x2=\"{1}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"2\"/>\
             <text x=\"{2}\" y=\"{3}\">{4}</text>",
            W - R + 10.0,
            W - R + 30.0,
            W - R + 36.0,
            ly + 4.0,
            line.label
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" fill=\"#555\">○ action: SIGTERM sent or OOM kill</text>\n</svg>",
        W - R + 10.0,
        T + 110.0
    );
    s
}
