//! The duration syntax of every flag that takes a duration, in the relay and the inbox alike.

use std::time::Duration;

/// A duration: humantime's spellings (`250ms`, `5m`, `1h 30m`, `2days`), and what the relay
/// accepted before humantime, which humantime does not: a bare number of seconds (`60`) and a
/// decimal count of one unit (`1.5s`, `0.5 h`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(duration) = humantime::parse_duration(text) {
        return Ok(duration);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let count: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 1s, 250ms, 5m or 1h"))?;
    let unit = match unit.trim() {
        "" => Duration::from_secs(1),
        unit => humantime::parse_duration(&format!("1{unit}")).map_err(|_| {
            format!("unknown unit {unit:?} in {text:?}: use ms, s, m or h (or min, d, w)")
        })?,
    };
    Duration::try_from_secs_f64(unit.as_secs_f64() * count).map_err(|e| format!("{text:?}: {e}"))
}

/// `--peer-timeout`: a duration within the range [`crate::liveness::PeerTimeout`] takes.
pub fn parse_peer_timeout(text: &str) -> Result<Duration, String> {
    crate::liveness::PeerTimeout::new(parse_duration(text)?).map(|timeout| timeout.get())
}
