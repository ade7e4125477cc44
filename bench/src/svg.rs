//! Small SVG plots for the eviction report: a frame with axes, ticks and a legend below the plot area (so no
//! label leaves the picture), and three kinds of content: lines over time, dots per run, a zoom around the
//! crossing.

use std::fmt::Write;

/// The agents' colours, in the report's agent order.
pub const COLORS: [&str; 4] = ["#d62728", "#ff7f0e", "#7f7f7f", "#1f77b4"];
const W: f64 = 860.0;
/// Plot area height.
const PLOT_H: f64 = 320.0;
/// Margins: left, right, top; below the plot area come the tick labels, the axis label and the legend.
const L: f64 = 80.0;
const R: f64 = 30.0;
const T: f64 = 44.0;
const LEGEND_ROW: f64 = 20.0;

/// One axis.
pub struct Axis {
    pub min: f64,
    pub max: f64,
    /// Logarithmic (min must be > 0).
    pub log: bool,
    /// Draw ticks and grid lines.
    pub ticks: bool,
    pub label: String,
}

impl Axis {
    pub fn linear(min: f64, max: f64, label: &str) -> Self {
        Self { min, max: if max > min { max } else { min + 1.0 }, log: false, ticks: true, label: label.to_owned() }
    }

    /// A logarithmic axis; `min` is raised to a small positive value when it is not positive.
    pub fn log(min: f64, max: f64, label: &str) -> Self {
        let min = if min > 0.0 { min } else { 0.1 };
        Self { min, max: if max > min { max } else { min * 10.0 }, log: true, ticks: true, label: label.to_owned() }
    }

    fn frac(&self, v: f64) -> f64 {
        if self.log {
            let (a, b) = (self.min.max(1e-9).log10(), self.max.max(1e-9).log10());
            (v.max(1e-9).log10() - a) / (b - a)
        } else {
            (v - self.min) / (self.max - self.min)
        }
    }

    fn ticks(&self) -> Vec<f64> {
        if !self.ticks {
            return Vec::new();
        }
        if self.log {
            let mut out = Vec::new();
            let mut decade = 10f64.powf(self.min.log10().floor());
            while decade <= self.max {
                for m in [1.0, 2.0, 5.0] {
                    let v = decade * m;
                    if v >= self.min && v <= self.max {
                        out.push(v);
                    }
                }
                decade *= 10.0;
            }
            return out;
        }
        let raw = (self.max - self.min) / 8.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(raw);
        let mut v = (self.min / step).ceil() * step;
        let mut out = Vec::new();
        while v <= self.max + step * 1e-9 {
            out.push(if v.abs() < step * 1e-9 { 0.0 } else { v });
            v += step;
        }
        out
    }
}

fn tick_label(v: f64) -> String {
    if v.abs() >= 10.0 || v == v.round() { format!("{v:.0}") } else { format!("{v:.1}") }
}

/// Escapes text for SVG.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// How a legend entry is drawn.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    Line,
    Dot,
    Ring,
}

/// A legend entry: colour, label, mark.
pub struct Legend {
    pub color: String,
    pub label: String,
    pub mark: Mark,
}

/// A plot being drawn: the frame is written at creation, content is added, `finish` adds the legend.
pub struct Plot {
    s: String,
    x: Axis,
    y: Axis,
    h: f64,
}

impl Plot {
    /// A frame with `legend_rows` rows of legend below it.
    pub fn new(title: &str, x: Axis, y: Axis, legend_rows: usize) -> Self {
        let h = T + PLOT_H + 56.0 + LEGEND_ROW * legend_rows as f64 + 10.0;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" viewBox=\"0 0 {W} {h}\" \
             font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
             <text x=\"{}\" y=\"24\" font-size=\"14\" text-anchor=\"middle\">{}</text>",
            W / 2.0,
            esc(title)
        );
        let p = Self { s, x, y, h };
        p.frame()
    }

    fn bottom() -> f64 {
        T + PLOT_H
    }

    /// x in pixels, clamped to the plot area.
    pub fn px(&self, x: f64) -> f64 {
        L + self.x.frac(x).clamp(0.0, 1.0) * (W - L - R)
    }

    /// y in pixels, clamped to the plot area.
    pub fn py(&self, y: f64) -> f64 {
        Self::bottom() - self.y.frac(y).clamp(0.0, 1.0) * PLOT_H
    }

    fn frame(mut self) -> Self {
        let b = Self::bottom();
        let _ = writeln!(
            self.s,
            "<rect x=\"{L}\" y=\"{T}\" width=\"{}\" height=\"{PLOT_H}\" fill=\"none\" stroke=\"black\"/>",
            W - L - R
        );
        for t in self.x.ticks() {
            let x = self.px(t);
            let _ = writeln!(
                self.s,
                "<line x1=\"{x:.1}\" y1=\"{T}\" x2=\"{x:.1}\" y2=\"{b}\" stroke=\"#eee\"/>\
                 <text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                b + 16.0,
                tick_label(t)
            );
        }
        for t in self.y.ticks() {
            let y = self.py(t);
            let _ = writeln!(
                self.s,
                "<line x1=\"{L}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#eee\"/>\
                 <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                W - R,
                L - 6.0,
                y + 4.0,
                tick_label(t)
            );
        }
        let mid_y = T + PLOT_H / 2.0;
        let _ = writeln!(
            self.s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n\
             <text x=\"18\" y=\"{mid_y}\" transform=\"rotate(-90 18 {mid_y})\" text-anchor=\"middle\">{}</text>",
            (L + W - R) / 2.0,
            b + 36.0,
            esc(&self.x.label),
            esc(&self.y.label)
        );
        self
    }

    /// A horizontal dashed line with a label at its right end, inside the plot area.
    pub fn hline(&mut self, y: f64, label: &str) {
        let py = self.py(y);
        let _ = writeln!(
            self.s,
            "<line x1=\"{L}\" y1=\"{py:.1}\" x2=\"{}\" y2=\"{py:.1}\" stroke=\"black\" stroke-dasharray=\"6 4\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            W - R,
            W - R - 4.0,
            py - 4.0,
            esc(label)
        );
    }

    /// A vertical dashed line with a label at its top, inside the plot area.
    pub fn vline(&mut self, x: f64, label: &str) {
        let px = self.px(x);
        let _ = writeln!(
            self.s,
            "<line x1=\"{px:.1}\" y1=\"{T}\" x2=\"{px:.1}\" y2=\"{}\" stroke=\"black\" stroke-dasharray=\"2 3\"/>\
             <text x=\"{:.1}\" y=\"{}\">{}</text>",
            Self::bottom(),
            px + 4.0,
            T + 14.0,
            esc(label)
        );
    }

    /// A polyline of (x, y) points within the x axis' range.
    pub fn line(&mut self, points: &[(f64, f64)], color: &str, width: f64, opacity: f64) {
        let pts: Vec<String> = points
            .iter()
            .filter(|(x, _)| *x >= self.x.min && *x <= self.x.max)
            .map(|(x, y)| format!("{:.1},{:.1}", self.px(*x), self.py(*y)))
            .collect();
        let _ = writeln!(
            self.s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"{width}\" stroke-opacity=\"{opacity}\" \
             points=\"{}\"/>",
            pts.join(" ")
        );
    }

    /// A marker: a ring (an action) or a filled dot (a run).
    pub fn dot(&mut self, x: f64, y: f64, color: &str, ring: bool) {
        let (fill, r) = if ring { ("none", 5.0) } else { (color, 4.0) };
        let _ = writeln!(
            self.s,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"{r}\" fill=\"{fill}\" fill-opacity=\"0.7\" stroke=\"{color}\" \
             stroke-width=\"2\"/>",
            self.px(x),
            self.py(y)
        );
    }

    /// A short vertical bar (a median) at (x, y), `half` pixels up and down.
    pub fn tick(&mut self, x: f64, y: f64, half: f64, color: &str) {
        let (px, py) = (self.px(x), self.py(y));
        let _ = writeln!(
            self.s,
            "<line x1=\"{px:.1}\" y1=\"{:.1}\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"{color}\" stroke-width=\"3\"/>",
            py - half,
            py + half
        );
    }

    /// Text at data coordinates, shifted by (dx, dy) pixels, anchored at its start; kept inside the plot area.
    pub fn text(&mut self, x: f64, y: f64, dx: f64, dy: f64, text: &str) {
        let width = text.chars().count() as f64 * 6.8;
        let px = (self.px(x) + dx).min(W - R - width - 4.0).max(L + 4.0);
        let _ = writeln!(self.s, "<text x=\"{px:.1}\" y=\"{:.1}\">{}</text>", self.py(y) + dy, esc(text));
    }

    /// A row label: at the left edge inside the plot area, just above the row's line.
    pub fn row_label(&mut self, y: f64, text: &str) {
        let _ = writeln!(
            self.s,
            "<text x=\"{}\" y=\"{:.1}\" font-weight=\"bold\">{}</text>",
            L + 6.0,
            self.py(y) - 26.0,
            esc(text)
        );
    }

    /// The legend below the plot, one entry per row, and the closing tag.
    pub fn finish(mut self, legend: &[Legend]) -> String {
        let mut y = Self::bottom() + 58.0;
        for e in legend {
            let (c, label) = (&e.color, esc(&e.label));
            let _ = match e.mark {
                Mark::Line => write!(
                    self.s,
                    "<line x1=\"{L}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{c}\" stroke-width=\"2\"/>",
                    L + 22.0
                ),
                Mark::Dot => write!(self.s, "<circle cx=\"{}\" cy=\"{y}\" r=\"4\" fill=\"{c}\"/>", L + 11.0),
                Mark::Ring => write!(
                    self.s,
                    "<circle cx=\"{}\" cy=\"{y}\" r=\"5\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"/>",
                    L + 11.0
                ),
            };
            let _ = writeln!(self.s, "<text x=\"{}\" y=\"{}\">{label}</text>", L + 30.0, y + 4.0);
            y += LEGEND_ROW;
        }
        debug_assert!(y <= self.h + LEGEND_ROW);
        self.s.push_str("</svg>\n");
        self.s
    }
}
