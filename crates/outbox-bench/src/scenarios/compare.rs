//! The setups of `outbox-bench bench --compare` (`--compare wal,poll:5,poll:5x1000,poll:5x500:delete`,
//! `--compare layout:default,layout:debezium`): one relay binary drained in the same run, so a
//! polling setup's rate is set against the WAL reader's measured beside it on the same servers,
//! rounds interleaved; never against a figure from another day (on this machine the load moves a
//! drain more than most levers). Their figures are [`crate::measurement::results::compare`],
//! their Markdown [`crate::report::compare`]; `suite::compare_runs` runs them.

use std::fmt;
use std::str::FromStr;

/// `poll --workers` accepts 1 to this (src/config.rs): refused here before any run starts.
const MAX_WORKERS: u32 = 256;
/// `poll --batch-size` accepts 1 to this.
const MAX_BATCH_SIZE: u32 = 100_000;

/// One setup of `--compare`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareSetup {
    /// `wal`: the WAL reader (`run`) at --max-in-flight.
    Wal,
    /// `layout:default`, `layout:debezium`: the WAL reader as `wal`, on rows that each carry
    /// an aggregate, in a table of that layout (docs/table-layouts.md): the two differ only in
    /// the column map and the routing-key template.
    Layout(Layout),
    /// `poll:WORKERS[xBATCH][:delete]`: `poll --workers WORKERS [--batch-size BATCH]
    /// [--on-published delete]`.
    Poll {
        workers: u32,
        /// None: the relay's default batch size.
        batch_size: Option<u32>,
        delete: bool,
    },
}

/// The outbox table a `layout:` setup drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The contract's column names; the relay's default flags (routing key: the event type).
    Default,
    /// Debezium's Outbox Event Router names for the event type and the aggregate; the relay
    /// with `--table-layout debezium --routing-key '{aggregate_type}.{event_type}'`.
    Debezium,
}

impl FromStr for CompareSetup {
    type Err = String;

    fn from_str(text: &str) -> Result<CompareSetup, String> {
        let spec = text.trim();
        let usage = "expected wal, layout:default, layout:debezium, poll:WORKERS or \
                     poll:WORKERSxBATCH (e.g. poll:5x1000), a poll setup optionally followed by \
                     :delete";
        let (kind, options) = match spec.split_once(':') {
            Some((kind, options)) => (kind, Some(options)),
            None => (spec, None),
        };
        match (kind, options) {
            ("wal", None) => Ok(CompareSetup::Wal),
            ("wal", Some(_)) => Err(format!(
                "setup `{spec}`: wal takes no options (it runs at --max-in-flight)"
            )),
            ("layout", Some("default")) => Ok(CompareSetup::Layout(Layout::Default)),
            ("layout", Some("debezium")) => Ok(CompareSetup::Layout(Layout::Debezium)),
            ("layout", _) => Err(format!(
                "setup `{spec}`: a layout is layout:default or layout:debezium"
            )),
            ("poll", None) | ("poll", Some("")) => Err(format!(
                "setup `{spec}`: poll needs a number of workers, e.g. poll:5 or poll:5x1000"
            )),
            ("poll", Some(options)) => {
                let (sizes, suffix) = match options.split_once(':') {
                    Some((sizes, suffix)) => (sizes, Some(suffix)),
                    None => (options, None),
                };
                let delete = match suffix {
                    None => false,
                    Some("delete") => true,
                    Some(other) => {
                        return Err(format!(
                            "setup `{spec}`: unknown suffix `{other}` (only `delete`, for \
                             --on-published delete)"
                        ))
                    }
                };
                let (workers, batch_size) = match sizes.split_once('x') {
                    Some((workers, batch_size)) => (workers, Some(batch_size)),
                    None => (sizes, None),
                };
                Ok(CompareSetup::Poll {
                    workers: count(spec, "workers", workers, MAX_WORKERS)?,
                    batch_size: batch_size
                        .map(|b| count(spec, "batch size", b, MAX_BATCH_SIZE))
                        .transpose()?,
                    delete,
                })
            }
            ("", _) => Err(format!("an empty setup: {usage}")),
            _ => Err(format!("unknown setup `{spec}`: {usage}")),
        }
    }
}

/// `text` as a number from 1 to `max`, or an error naming the setup and the field.
fn count(spec: &str, what: &str, text: &str, max: u32) -> Result<u32, String> {
    let n: u32 = text
        .parse()
        .map_err(|_| format!("setup `{spec}`: {what} `{text}` is not a whole number"))?;
    if n == 0 || n > max {
        return Err(format!(
            "setup `{spec}`: {what} must be 1 to {max}, not {n}"
        ));
    }
    Ok(n)
}

/// The canonical spelling, which names the setup in the report (`poll:05` is `poll:5`).
impl fmt::Display for CompareSetup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompareSetup::Wal => f.write_str("wal"),
            CompareSetup::Layout(Layout::Default) => f.write_str("layout:default"),
            CompareSetup::Layout(Layout::Debezium) => f.write_str("layout:debezium"),
            CompareSetup::Poll {
                workers,
                batch_size,
                delete,
            } => {
                write!(f, "poll:{workers}")?;
                if let Some(batch_size) = batch_size {
                    write!(f, "x{batch_size}")?;
                }
                if *delete {
                    f.write_str(":delete")?;
                }
                Ok(())
            }
        }
    }
}

/// An error if a setup is listed twice (its runs would be pooled into one median).
pub fn check_distinct(setups: &[CompareSetup]) -> Result<(), String> {
    for (i, setup) in setups.iter().enumerate() {
        if setups[..i].contains(setup) {
            return Err(format!("--compare lists setup `{setup}` twice"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<CompareSetup, String> {
        text.parse()
    }

    #[test]
    fn setups_parse() {
        assert_eq!(parse("wal"), Ok(CompareSetup::Wal));
        assert_eq!(
            parse("layout:default"),
            Ok(CompareSetup::Layout(Layout::Default))
        );
        assert_eq!(
            parse(" layout:debezium "),
            Ok(CompareSetup::Layout(Layout::Debezium))
        );
        assert_eq!(
            parse(" poll:5 "),
            Ok(CompareSetup::Poll {
                workers: 5,
                batch_size: None,
                delete: false
            })
        );
        assert_eq!(
            parse("poll:2x500"),
            Ok(CompareSetup::Poll {
                workers: 2,
                batch_size: Some(500),
                delete: false
            })
        );
        assert_eq!(
            parse("poll:5x500:delete"),
            Ok(CompareSetup::Poll {
                workers: 5,
                batch_size: Some(500),
                delete: true
            })
        );
        assert_eq!(
            parse("poll:1:delete"),
            Ok(CompareSetup::Poll {
                workers: 1,
                batch_size: None,
                delete: true
            })
        );
    }

    #[test]
    fn setups_print_canonically() {
        for (text, shown) in [
            ("wal", "wal"),
            ("layout:default", "layout:default"),
            ("layout:debezium", "layout:debezium"),
            ("poll:05", "poll:5"),
            ("poll:5x1000", "poll:5x1000"),
            ("poll:5x500:delete", "poll:5x500:delete"),
        ] {
            assert_eq!(parse(text).map(|s| s.to_string()), Ok(shown.to_string()));
        }
    }

    #[test]
    fn bad_setups_say_what_is_wrong() {
        let error = |text: &str| parse(text).expect_err(text);
        assert!(error("").contains("an empty setup"));
        assert!(error("kafka").contains("unknown setup `kafka`: expected wal"));
        assert!(error("wal:4096").contains("wal takes no options"));
        assert!(error("layout").contains("a layout is layout:default or layout:debezium"));
        assert!(error("layout:").contains("a layout is layout:default or layout:debezium"));
        assert!(error("layout:outbox").contains("a layout is layout:default or layout:debezium"));
        assert!(error("layout:Debezium").contains("a layout is layout:default"));
        assert!(error("poll").contains("poll needs a number of workers"));
        assert!(error("poll:").contains("poll needs a number of workers"));
        assert!(error("poll:five").contains("workers `five` is not a whole number"));
        assert!(error("poll:0").contains("workers must be 1 to 256, not 0"));
        assert!(error("poll:257").contains("workers must be 1 to 256"));
        assert!(error("poll:5x").contains("batch size `` is not a whole number"));
        assert!(error("poll:5x0").contains("batch size must be 1 to 100000"));
        assert!(error("poll:5x500:mark").contains("unknown suffix `mark`"));
        assert!(error("poll:-1").contains("is not a whole number"));
    }

    #[test]
    fn a_setup_listed_twice_is_refused() {
        let setups: Vec<CompareSetup> = ["wal", "poll:5", "poll:05"]
            .iter()
            .map(|t| parse(t).expect(t))
            .collect();
        assert_eq!(
            check_distinct(&setups),
            Err("--compare lists setup `poll:5` twice".to_string())
        );
        assert_eq!(check_distinct(&setups[..2]), Ok(()));
    }
}
