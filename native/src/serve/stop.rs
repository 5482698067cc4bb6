//! Stop sequences over streamed text: text is handed out as soon as it can no longer be the start
//! of a stop string, and generation ends at the first stop string (which is not handed out).

/// Watches the generated text for any of a request's stop strings.
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What [`StopMatcher::push`] lets through.
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    /// Text that is safe to send.
    pub text: String,
    /// Whether a stop string was found (generation ends; the stop string and what follows it are
    /// dropped).
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds newly generated text; returns what can be sent now.
    pub fn push(&mut self, text: &str) -> Released {
        self.held.push_str(text);
        let first_stop = self.stops.iter().filter_map(|s| self.held.find(s)).min();
        if let Some(at) = first_stop {
            let text = self.held[..at].to_owned();
            self.held.clear();
            return Released {
                text,
                stopped: true,
            };
        }
        let keep = self.partial_suffix_len();
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_owned();
        self.held.drain(..cut);
        Released {
            text,
            stopped: false,
        }
    }

    /// The text still held back (at the end of generation it is sent: no stop string completed).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of the held text that is a proper prefix of a stop string.
    fn partial_suffix_len(&self) -> usize {
        let held = &self.held;
        let mut best = 0;
        for stop in &self.stops {
            let longest = (stop.len() - 1).min(held.len());
            for len in (best + 1..=longest).rev() {
                let start = held.len() - len;
                if held.is_char_boundary(start) && stop.starts_with(&held[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn without_stops_everything_passes_at_once() {
        let mut m = StopMatcher::new(vec![String::new()]);
        assert_eq!(
            m.push("abc"),
            Released {
                text: "abc".into(),
                stopped: false
            }
        );
    }

    #[test]
    fn a_stop_split_over_pieces_is_found_and_dropped() {
        assert_eq!(
            run(&["\n\n"], &["Hello", " world\n", "\nmore"]),
            ("Hello world".into(), true)
        );
        assert_eq!(run(&["END"], &["aE", "N", "Dz"]), ("a".into(), true));
    }

    #[test]
    fn a_partial_match_is_held_then_released() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("xE").text, "x");
        assert_eq!(m.push("Nd").text, "ENd");
        assert_eq!(run(&["END"], &["E", "N"]), ("EN".into(), false));
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        assert_eq!(run(&["b", "a"], &["xxab"]), ("xx".into(), true));
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        assert_eq!(run(&["é!"], &["café", "é", "?"]), ("caféé?".into(), false));
        assert_eq!(run(&["é!"], &["café", "!"]), ("caf".into(), true));
    }
}
