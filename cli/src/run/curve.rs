//! The reward curve of a train run as an SVG picture (`reward-curve.svg`): mean reward and
//! pass rate per optimizer step, for a person to look at. Pure: steps in, text out.

/// One point per step: (step, reward mean, pass rate).
pub fn svg(points: &[(u64, f64, f64)], title: &str) -> String {
    const W: f64 = 640.0;
    const H: f64 = 360.0;
    const L: f64 = 56.0;
    const R: f64 = 16.0;
    const T: f64 = 36.0;
    const B: f64 = 44.0;
    let last = points.iter().map(|p| p.0).max().unwrap_or(1).max(1) as f64;
    let first = points.iter().map(|p| p.0).min().unwrap_or(0) as f64;
    let span = (last - first).max(1.0);
    let lo = points.iter().map(|p| p.1).fold(0.0_f64, f64::min).min(0.0);
    let hi = points.iter().map(|p| p.1).fold(1.0_f64, f64::max);
    let x = |s: u64| L + (s as f64 - first) / span * (W - L - R);
    let y = |v: f64| T + (hi - v) / (hi - lo).max(1e-9) * (H - T - B);
    let line = |pick: &dyn Fn(&(u64, f64, f64)) -> f64| {
        points
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.0), y(pick(p))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{L}\" y=\"20\" font-size=\"14\">{}</text>\n",
        escape(title)
    );
    for i in 0..=4 {
        let v = lo + (hi - lo) * f64::from(i) / 4.0;
        out.push_str(&format!(
            "<line x1=\"{L}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:.2}</text>\n",
            W - R,
            L - 6.0,
            y(v) + 4.0,
            y = y(v)
        ));
    }
    out.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">optimizer step ({} to {})</text>\n",
        (L + W - R) / 2.0,
        H - 12.0,
        first,
        last
    ));
    out.push_str(&format!(
        "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"{}\"/>\n",
        line(&|p| p.1)
    ));
    out.push_str(&format!(
        "<polyline fill=\"none\" stroke=\"#ff7f0e\" stroke-width=\"2\" stroke-dasharray=\"5,3\" points=\"{}\"/>\n",
        line(&|p| p.2)
    ));
    out.push_str(&format!(
        "<text x=\"{:.1}\" y=\"20\" fill=\"#1f77b4\" text-anchor=\"end\">— reward mean</text><text x=\"{:.1}\" y=\"34\" fill=\"#ff7f0e\" text-anchor=\"end\">- - pass rate</text>\n</svg>\n",
        W - R - 6.0,
        W - R - 6.0
    ));
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_is_a_point_of_both_lines() {
        let s = svg(&[(1, 0.1, 0.0), (2, 0.5, 0.25), (3, 0.9, 1.0)], "job <x>");
        let lines: Vec<&str> = s.lines().filter(|l| l.starts_with("<polyline")).collect();
        assert_eq!(lines.len(), 2);
        for l in lines {
            let points = l.split("points=\"").nth(1).unwrap_or("");
            assert_eq!(points.trim_end_matches("\"/>").split(' ').count(), 3, "{l}");
        }
        assert!(s.contains("job &lt;x&gt;"));
        // Higher reward is drawn higher (smaller y).
        let reward = s
            .lines()
            .find(|l| l.contains("#1f77b4\" stroke-width"))
            .unwrap_or("");
        let ys: Vec<f64> = reward
            .split("points=\"")
            .nth(1)
            .unwrap_or("")
            .trim_end_matches("\"/>")
            .split(' ')
            .filter_map(|p| p.split(',').nth(1)?.parse().ok())
            .collect();
        assert!(ys.windows(2).all(|w| w[1] < w[0]), "{ys:?}");
    }

    #[test]
    fn no_steps_is_still_a_picture() {
        assert!(svg(&[], "empty").ends_with("</svg>\n"));
    }
}
