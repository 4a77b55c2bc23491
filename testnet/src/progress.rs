//! The progress display: an indicatif bar over the replayed intervals with a status line
//! (epoch, D x P, step, loss, nodes) on a terminal; one plain line per interval otherwise, so
//! that CI logs show the same story without control characters.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

use crate::monitor::Sample;

/// Progress of one run on stderr.
pub struct Progress {
    bar: Option<ProgressBar>,
    label: String,
    last_plain: Option<u64>,
}

impl Progress {
    /// A display for the run called `label` (e.g. the strategy).
    pub fn new(label: &str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(1);
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix:>8} [{bar:24}] {pos}/{len} intervals {elapsed:>4} | {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar.set_prefix(label.to_string());
            bar
        });
        Self {
            bar,
            label: label.to_string(),
            last_plain: None,
        }
    }

    /// Shows a free-form message (setup phases).
    pub fn message(&self, msg: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(msg.to_string()),
            None => eprintln!("[{}] {msg}", self.label),
        }
    }

    /// Shows interval `pos` of `len` and the latest sample.
    pub fn update(&mut self, pos: u64, len: u64, s: &Sample) {
        let line = status_line(s);
        match &self.bar {
            Some(bar) => {
                bar.set_length(len);
                bar.set_position(pos);
                bar.set_message(line);
            }
            None if self.last_plain != Some(pos) => {
                self.last_plain = Some(pos);
                eprintln!("[{}] interval {pos}/{len} | {line}", self.label);
            }
            None => {}
        }
    }

    /// Prints a line above the bar.
    pub fn println(&self, msg: &str) {
        match &self.bar {
            Some(bar) => bar.println(msg),
            None => eprintln!("[{}] {msg}", self.label),
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// `epoch 3 | 2x2 | step 140 | loss 3.210 | nodes 5/6`.
pub fn status_line(s: &Sample) -> String {
    let config = s
        .config
        .map_or_else(|| "-".to_string(), |(d, p)| format!("{d}x{p}"));
    let loss = s
        .loss
        .map_or_else(|| "-".to_string(), |l| format!("{l:.3}"));
    format!(
        "epoch {} | {config} | step {} | loss {loss} | nodes {}/{}",
        s.epoch, s.step, s.running, s.target
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_line_shows_everything_or_dashes() {
        let mut s = Sample {
            t: 1.0,
            running: 5,
            target: 6,
            epoch: 3,
            config: Some((2, 2)),
            step: 140,
            samples: 0,
            loss: Some(3.2101),
        };
        assert_eq!(
            status_line(&s),
            "epoch 3 | 2x2 | step 140 | loss 3.210 | nodes 5/6"
        );
        s.config = None;
        s.loss = None;
        assert_eq!(
            status_line(&s),
            "epoch 3 | - | step 140 | loss - | nodes 5/6"
        );
    }
}
