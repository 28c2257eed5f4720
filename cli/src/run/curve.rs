//! The reward curve of a train run as an SVG picture (`reward-curve.svg`), for a person to look
//! at: by policy version, the mean reward and pass rate of every session it sampled (groups the
//! trainer dropped for all passing or all failing included), beside the mean reward of the
//! groups each step trained on, at the version that step made. The trained groups alone read lower
//! as the policy improves: a group that all passes teaches nothing and is dropped. Pure: series
//! in, text out.

use serde_json::Value;

use super::held_out::RoundReport;

/// One line of the picture.
pub struct Series {
    pub name: &'static str,
    pub color: &'static str,
    /// SVG `stroke-dasharray`, or empty for a solid line.
    pub dash: &'static str,
    /// (policy version or step, value).
    pub points: Vec<(u64, f64)>,
}

pub fn svg(series: &[Series], title: &str) -> String {
    const W: f64 = 640.0;
    const H: f64 = 360.0;
    const L: f64 = 56.0;
    const R: f64 = 16.0;
    const T: f64 = 36.0;
    const B: f64 = 44.0;
    let all = || series.iter().flat_map(|s| s.points.iter());
    let last = all().map(|p| p.0).max().unwrap_or(1).max(1) as f64;
    let first = all().map(|p| p.0).min().unwrap_or(0) as f64;
    let span = (last - first).max(1.0);
    let lo = all().map(|p| p.1).fold(0.0_f64, f64::min).min(0.0);
    let hi = all().map(|p| p.1).fold(1.0_f64, f64::max);
    let x = |s: u64| L + (s as f64 - first) / span * (W - L - R);
    let y = |v: f64| T + (hi - v) / (hi - lo).max(1e-9) * (H - T - B);
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
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">policy version ({} to {})</text>\n",
        (L + W - R) / 2.0,
        H - 12.0,
        first,
        last
    ));
    for (i, s) in series.iter().enumerate() {
        let points: Vec<String> = s
            .points
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1)))
            .collect();
        let dash = if s.dash.is_empty() {
            String::new()
        } else {
            format!(" stroke-dasharray=\"{}\"", s.dash)
        };
        out.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{dash} points=\"{}\"/>\n",
            s.color,
            points.join(" ")
        ));
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{}\" text-anchor=\"end\">{}</text>\n",
            W - R - 6.0,
            20.0 + 14.0 * i as f64,
            s.color,
            escape(s.name)
        ));
    }
    out.push_str("</svg>\n");
    out
}

/// The reward curve's lines: every session's mean reward and pass rate by the policy version
/// that sampled it (dropped groups included), the trained groups' mean reward by the version
/// their step made, and the
/// held-out rounds' pass rate by the step they measure.
pub fn series(status: &Value, held_out: &[RoundReport]) -> Vec<Series> {
    let rows = |key: &str, x: &str, y: &str| -> Vec<(u64, f64)> {
        status[key]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| (r[x].as_u64().unwrap_or(0), r[y].as_f64().unwrap_or(0.0)))
            .collect()
    };
    let mut lines = vec![
        Series {
            name: "— reward, every session sampled",
            color: "#1f77b4",
            dash: "",
            points: rows("sampled", "policyVersion", "rewardMean"),
        },
        Series {
            name: "- - pass rate, every session sampled",
            color: "#ff7f0e",
            dash: "5,3",
            points: rows("sampled", "policyVersion", "passRate"),
        },
        Series {
            name: "··· reward, groups trained by the step that made it",
            color: "#7f7f7f",
            dash: "2,3",
            // By the version the step made, not its number: a trainer resumed after a crash
            // skips the versions it lost, and every other line is by version.
            points: rows("steps", "policyVersion", "rewardMean"),
        },
    ];
    // How often each version ran over its token cap (`grpo.overlong`), when any did.
    let overlong = rows("sampled", "policyVersion", "overlongFraction");
    if overlong.iter().any(|(_, f)| *f > 0.0) {
        lines.push(Series {
            name: "-· overlong fraction, every session sampled",
            color: "#d62728",
            dash: "6,2,2,2",
            points: overlong,
        });
    }
    if !held_out.is_empty() {
        lines.push(Series {
            name: "— held-out pass rate, by the step measured",
            color: "#2ca02c",
            dash: "",
            points: held_out
                .iter()
                .filter_map(|r| Some((r.step, r.pass_rate?)))
                .collect(),
        });
    }
    lines
}

/// `reward-curve.svg` in `out`, from the trainer's last status.
pub fn write(
    out: &std::path::Path,
    status: &Value,
    held_out: &[RoundReport],
    job: &str,
) -> std::io::Result<()> {
    std::fs::write(
        out.join("reward-curve.svg"),
        svg(
            &series(status, held_out),
            &format!("{job}: reward by policy version"),
        ),
    )
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(points: Vec<(u64, f64)>) -> Series {
        Series {
            name: "reward <mean>",
            color: "#1f77b4",
            dash: "",
            points,
        }
    }

    #[test]
    fn every_point_of_every_series_is_drawn_and_higher_reward_is_higher() {
        let pass = Series {
            name: "pass rate",
            color: "#ff7f0e",
            dash: "5,3",
            points: vec![(0, 0.0), (1, 0.25), (2, 1.0)],
        };
        let s = svg(&[one(vec![(0, 0.1), (1, 0.5), (2, 0.9)]), pass], "job <x>");
        let lines: Vec<&str> = s.lines().filter(|l| l.starts_with("<polyline")).collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[1].contains("stroke-dasharray=\"5,3\""));
        for l in &lines {
            let points = l.split("points=\"").nth(1).unwrap_or("");
            assert_eq!(points.trim_end_matches("\"/>").split(' ').count(), 3, "{l}");
        }
        assert!(s.contains("job &lt;x&gt;") && s.contains("reward &lt;mean&gt;"));
        let ys: Vec<f64> = lines[0]
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
    fn the_overlong_line_is_drawn_when_a_version_ran_over() {
        let status = |f: f64| {
            serde_json::json!({"sampled": [
                {"policyVersion": 0, "rewardMean": 0.2, "passRate": 0.1, "overlongFraction": f},
                {"policyVersion": 1, "rewardMean": 0.5, "passRate": 0.4, "overlongFraction": 0.0}]})
        };
        let names = |f| -> Vec<&str> { series(&status(f), &[]).iter().map(|s| s.name).collect() };
        assert!(names(0.5).iter().any(|n| n.contains("overlong")));
        assert!(
            !names(0.0).iter().any(|n| n.contains("overlong")),
            "never ran over"
        );
        let older = serde_json::json!({"sampled": [{"policyVersion": 0, "rewardMean": 0.2}]});
        assert_eq!(
            series(&older, &[]).len(),
            3,
            "a trainer that does not count it"
        );
    }

    /// A trainer resumed after a crash lost versions 12 to 15: its step 11 made version 16.
    /// The trained groups' point is at the version, where the other lines put theirs.
    #[test]
    fn the_trained_groups_are_drawn_at_the_version_their_step_made() {
        let status = serde_json::json!({
            "sampled": [{"policyVersion": 16, "rewardMean": 0.5, "passRate": 0.5}],
            "steps": [{"step": 11, "policyVersion": 16, "rewardMean": 0.25}]});
        let lines = series(&status, &[]);
        let trained = lines
            .iter()
            .find(|s| s.name.contains("groups trained"))
            .expect("the trained line");
        assert_eq!(trained.points, [(16, 0.25)]);
    }

    #[test]
    fn no_steps_is_still_a_picture() {
        assert!(svg(&[], "empty").ends_with("</svg>\n"));
        assert!(svg(&[one(vec![])], "empty").ends_with("</svg>\n"));
    }
}
