//! What a chart shows, as data: [`super`] picks the figures into these, [`super::draw`] lays
//! them out. A module of its own so that neither imports the other for it.

/// Grouped horizontal bars: one bar per series in each group.
#[derive(Debug)]
pub(super) struct Bars {
    pub(super) title: String,
    pub(super) x_desc: String,
    pub(super) series: Vec<String>,
    pub(super) groups: Vec<BarGroup>,
    /// The legend's words for a bar's reference tick ([`Bar::reference`]).
    pub(super) reference_desc: String,
    pub(super) notes: Vec<String>,
}

#[derive(Debug)]
pub(super) struct BarGroup {
    pub(super) name: String,
    /// One per series; `None`: not measured in this run.
    pub(super) bars: Vec<Option<Bar>>,
}

#[derive(Debug)]
pub(super) struct Bar {
    pub(super) value: f64,
    pub(super) label: String,
    /// The figure the bar is set against (its broker alone), drawn as a tick across the bar:
    /// a bar that ends short of its tick is below the broker alone, one past it above.
    pub(super) reference: Option<f64>,
}

/// Horizontal bars stacked from parts, one row each.
#[derive(Debug)]
pub(super) struct Stacked {
    pub(super) title: String,
    pub(super) x_desc: String,
    pub(super) parts: Vec<String>,
    pub(super) rows: Vec<StackedRow>,
    pub(super) notes: Vec<String>,
}

#[derive(Debug)]
pub(super) struct StackedRow {
    pub(super) name: String,
    /// One per part; `None`: no figure (no such process in the setup, or not read).
    pub(super) parts: Vec<Option<f64>>,
}

/// Cumulative distributions on a log axis.
#[derive(Debug)]
pub(super) struct Cdf {
    pub(super) title: String,
    pub(super) x_desc: String,
    pub(super) y_desc: String,
    pub(super) curves: Vec<Curve>,
    pub(super) notes: Vec<String>,
}

/// Where the latency axis starts at the latest: a message can reach the consumer before its
/// writer's COMMIT call has returned (the relay reads the WAL once it is flushed), which
/// measures as 0; such points are drawn at the axis' start and counted in a note.
pub(super) const LATENCY_FLOOR_MS: f64 = 0.1;

#[derive(Debug)]
pub(super) struct Curve {
    pub(super) name: String,
    /// (ms, share of messages 0..=1), ascending.
    pub(super) points: Vec<(f64, f64)>,
    /// Only p50, p99 and max were recorded: drawn dashed through those points.
    pub(super) coarse: bool,
    /// The same setup has the same colour in every chart: [`super::draw`]'s palette index.
    pub(super) colour: usize,
}

/// The sweep: two figures per window on the left axis, two on the right.
#[derive(Debug)]
pub(super) struct Sweep {
    pub(super) title: String,
    pub(super) x_desc: String,
    pub(super) y_desc: String,
    pub(super) y2_desc: String,
    /// Left axis: drain, broker alone; right axis: crash duplicates, their bound.
    pub(super) series: [String; 4],
    pub(super) points: Vec<SweepPoint>,
    pub(super) notes: Vec<String>,
}

#[derive(Debug)]
pub(super) struct SweepPoint {
    pub(super) window: u32,
    pub(super) drain: f64,
    pub(super) broker: Option<f64>,
    pub(super) duplicates: u64,
    pub(super) bound: u64,
}
