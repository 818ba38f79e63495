//! Dead peers: how every connection the relay or the inbox opens notices, within the peer
//! timeout, that the host at the other end is gone without closing it (a machine powered
//! off, a VM or zone lost, a firewall or NAT entry dropping packets).
//!
//! Such a peer sends nothing, not even a reset: without help a busy connection retransmits
//! for about 15 minutes and an idle one waits for the system's keepalive (off, or 2 hours)
//! before anything fails. One setting, `--peer-timeout` T, decides it for both ends of every
//! connection:
//!
//! ```text
//!  relay's socket (ordinary SQL, replication)          TCP_USER_TIMEOUT = T: data unacknowledged
//!                                                       for T drops the connection;
//!                                                       keepalive probes after T/2 idle, then
//!                                                       every (T - T/2)/3: an idle connection
//!                                                       finds out in about T too
//!  AMQP socket (the relay's and the inbox's)           the keepalives, no user timeout: the
//!                                                       heartbeat below notices a dead broker
//!  PostgreSQL's end of each session (startup options)  the same, as tcp_keepalives_idle,
//!                                                       _interval, _count and tcp_user_timeout:
//!                                                       the server ends a vanished relay's
//!                                                       sessions (its locks) in about T, not
//!                                                       2 hours
//!  PostgreSQL's end of the replication session         the keepalives, tcp_user_timeout=0:
//!                                                       the walsender of a vanished relay
//!                                                       ends after wal_sender_timeout (below)
//!  AMQP heartbeat (unless the URL sets heartbeat=)     T/2: lapin gives the connection up
//!                                                       after 2 heartbeats of silence (about
//!                                                       T), RabbitMQ a consumer after 2-3,
//!                                                       handing its deliveries to another
//! ```
//!
//! What T does not cut short: a peer that is alive but slow to answer. TCP acknowledges at
//! the kernel, whatever the process is doing, so a server busy for minutes on a statement
//! keeps its connection; that wait has its own bound (the statement timeout).
//!
//! What T does cut short: a peer that stops *reading* while data waits to go to it. Since
//! Linux 5.11 a zero window that lasts the user timeout ends the connection, answered probes
//! or not (checked on 6.18, 2026-12-05: ETIMEDOUT 2 s into a zero window under a 2 s
//! timeout). The relay stops reading its replication stream while a stalled broker holds its
//! window full, and the walsender always has WAL to send on a busy database: with a user
//! timeout on PostgreSQL's end, a broker stall longer than T cost a reconnect and a window
//! of re-publishes. So that end has none, and `wal_sender_timeout` (PostgreSQL's, 60 s by
//! default) ends a vanished relay's walsender; the relay's standby status updates go on
//! while it holds back, so a live relay never reaches it. The same holds the other way: a
//! broker stops reading a publisher's socket for as long as an alarm or credit flow lasts,
//! and a full window of large publishes fills it. So the AMQP socket has no user timeout
//! either; the broker's heartbeats go on while it blocks the relay (and it pauses its watch
//! of the relay's), so the heartbeat tells a dead broker from a blocked one.
//!
//! The policy is the process's: each binary sets it once from its flags ([`configure`])
//! before it connects anywhere, and every connection reads it where it is opened (the
//! relay's `db.rs`, [`crate::amqp`]), so no caller can open a connection without it.

use std::os::fd::AsFd;
use std::sync::RwLock;
use std::time::Duration;

/// The default `--peer-timeout`: a dead peer costs about this, plus the reconnect.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(5);
/// The default `--statement-timeout` of the runtime commands.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(60);
/// Unanswered keepalive probes before a connection is given up, where no user timeout
/// decides it first.
pub const KEEPALIVE_PROBES: u32 = 3;

/// How long a peer may stay silent (no acknowledgement of what was sent, no answer to a
/// keepalive probe) before its connection is given up. Whole seconds, at least one: the
/// server's settings and the probe timers count in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerTimeout(Duration);

impl Default for PeerTimeout {
    fn default() -> Self {
        PeerTimeout(DEFAULT_PEER_TIMEOUT)
    }
}

impl PeerTimeout {
    /// The shortest and longest timeout accepted.
    pub const MIN: Duration = Duration::from_secs(2);
    pub const MAX: Duration = Duration::from_secs(3600);

    /// `timeout` rounded down to whole seconds; an error naming the range outside it.
    pub fn new(timeout: Duration) -> Result<Self, String> {
        let whole = Duration::from_secs(timeout.as_secs());
        if !(Self::MIN..=Self::MAX).contains(&whole) {
            return Err(format!(
                "the peer timeout must be between {} s and {} s (got {:?})",
                Self::MIN.as_secs(),
                Self::MAX.as_secs(),
                timeout
            ));
        }
        Ok(PeerTimeout(whole))
    }

    pub fn get(self) -> Duration {
        self.0
    }

    /// Idle time before the first keepalive probe: half the timeout.
    pub fn keepalive_idle(self) -> Duration {
        Duration::from_secs((self.0.as_secs() / 2).max(1))
    }

    /// Time between probes: the rest of the timeout over the probes, so that the last one
    /// goes out about when the timeout ends.
    pub fn keepalive_interval(self) -> Duration {
        let rest = self.0.as_secs() - self.keepalive_idle().as_secs();
        Duration::from_secs((rest / u64::from(KEEPALIVE_PROBES)).max(1))
    }

    /// The socket options, for the replication client (which opens its own socket).
    pub fn tcp_keepalive(self) -> pgwire_replication::TcpKeepalive {
        pgwire_replication::TcpKeepalive {
            idle: self.keepalive_idle(),
            interval: self.keepalive_interval(),
            retries: KEEPALIVE_PROBES,
            user_timeout: Some(self.0),
        }
    }

    /// Sets the options on a connected TCP socket.
    pub fn apply(self, socket: &impl AsFd) -> std::io::Result<()> {
        self.apply_keepalives(socket)?;
        socket2::SockRef::from(socket).set_tcp_user_timeout(Some(self.0))
    }

    /// Sets the keepalives alone on a connected TCP socket: an AMQP socket, which a blocking
    /// broker stops reading for as long as it likes (see the module documentation).
    pub fn apply_keepalives(self, socket: &impl AsFd) -> std::io::Result<()> {
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(self.keepalive_idle())
            .with_interval(self.keepalive_interval())
            .with_retries(KEEPALIVE_PROBES);
        socket2::SockRef::from(socket).set_tcp_keepalive(&keepalive)
    }

    /// The same for PostgreSQL's end of a session, as startup options (`-c name=value`).
    pub fn server_settings(self) -> String {
        format!(
            "{} -c tcp_user_timeout={}",
            self.server_keepalives(),
            self.0.as_millis()
        )
    }

    /// PostgreSQL's end of a replication session: the keepalives, and no user timeout. The
    /// walsender sends WAL as fast as the relay reads it; a relay holding back for a stalled
    /// broker stops reading, and Linux ends a connection whose zero window lasts the user
    /// timeout (5.11 and later; answered probes do not keep it). PostgreSQL's own
    /// `wal_sender_timeout` ends a vanished relay's walsender instead: the relay's replies go
    /// on while it holds back (docs/network-failures.md, "Dead peers: what a vanished host
    /// costs").
    pub fn replication_server_settings(self) -> String {
        format!("{} -c tcp_user_timeout=0", self.server_keepalives())
    }

    fn server_keepalives(self) -> String {
        format!(
            "-c tcp_keepalives_idle={} -c tcp_keepalives_interval={} -c tcp_keepalives_count={}",
            self.keepalive_idle().as_secs(),
            self.keepalive_interval().as_secs(),
            KEEPALIVE_PROBES,
        )
    }

    /// The AMQP heartbeat asked for, in seconds, where the URL names none: half the
    /// timeout, rounded up. lapin gives a silent broker up after two heartbeats, and
    /// RabbitMQ gives a silent consumer's unacknowledged deliveries to another once it
    /// declares it dead, 2 to 3 heartbeats after it fell silent: both within about the
    /// timeout. It is what notices a dead broker: the AMQP socket has no user timeout.
    pub fn amqp_heartbeat(self) -> u16 {
        u16::try_from(self.0.as_secs().div_ceil(2)).unwrap_or(u16::MAX)
    }

    /// The stream protocol's heartbeat asked for, in seconds: a quarter of the timeout, at
    /// least 1. The stream client (rabbitmq-stream-client 0.11) closes a connection silent
    /// for four heartbeats, so a silent broker is given up after about the timeout (4 s at
    /// the least); at its default of 60 s that took 4 minutes.
    pub fn stream_heartbeat(self) -> u32 {
        u32::try_from(self.0.as_secs() / 4)
            .unwrap_or(u32::MAX)
            .max(1)
    }
}

/// What every connection of this process gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    pub peer_timeout: PeerTimeout,
    /// PostgreSQL's `statement_timeout` on the ordinary connections: set by the commands
    /// that run unattended (`run`, `poll`, `resync`), so that no query of theirs (the
    /// backfill's, the state's, a lock's) waits without end. `None`: the server's own
    /// (`setup` creates a slot, which waits for every running transaction).
    pub statement_timeout: Option<Duration>,
}

impl Policy {
    /// Startup options for an ordinary session: the peer timeout's, then the statement
    /// timeout.
    pub fn session_settings(&self) -> String {
        let mut settings = self.peer_timeout.server_settings();
        if let Some(timeout) = self.statement_timeout {
            settings.push_str(&format!(" -c statement_timeout={}", timeout.as_millis()));
        }
        settings
    }
}

static POLICY: RwLock<Policy> = RwLock::new(Policy {
    peer_timeout: PeerTimeout(DEFAULT_PEER_TIMEOUT),
    statement_timeout: None,
});

/// Sets the process's policy: before the first connection.
pub fn configure(policy: Policy) {
    *POLICY
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = policy;
}

/// The process's policy (the defaults until [`configure`]).
pub fn policy() -> Policy {
    *POLICY
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn the_probes_end_about_when_the_timeout_does() {
        for (timeout, idle, interval) in [(2, 1, 1), (5, 2, 1), (10, 5, 1), (30, 15, 5)] {
            let t = PeerTimeout::new(secs(timeout)).expect("in range");
            assert_eq!(t.keepalive_idle(), secs(idle), "{timeout}");
            assert_eq!(t.keepalive_interval(), secs(interval), "{timeout}");
            // Below 5 s the one-second floor of the timers decides; the user timeout still
            // ends the connection at the timeout.
            let last_probe = idle + interval * u64::from(KEEPALIVE_PROBES);
            assert!(
                timeout < 5 || last_probe <= timeout,
                "{timeout}: {last_probe}"
            );
        }
    }

    #[test]
    fn a_silent_stream_broker_is_given_up_after_about_the_timeout() {
        for (timeout, heartbeat) in [(2, 1), (5, 1), (8, 2), (30, 7), (3600, 900)] {
            let t = PeerTimeout::new(secs(timeout)).expect("in range");
            assert_eq!(t.stream_heartbeat(), heartbeat, "{timeout}");
            // The client closes after four silent heartbeats: the timeout, or its 4 s floor.
            assert!(u64::from(4 * heartbeat) <= timeout.max(4), "{timeout}");
        }
    }

    #[test]
    fn out_of_range_timeouts_are_refused_and_fractions_rounded_down() {
        assert!(PeerTimeout::new(Duration::from_millis(1500)).is_err());
        assert!(PeerTimeout::new(secs(3601)).is_err());
        let e = PeerTimeout::new(secs(0)).expect_err("zero");
        assert!(e.contains("between 2 s and 3600 s"), "{e}");
        assert_eq!(
            PeerTimeout::new(Duration::from_millis(5900))
                .expect("5 s")
                .get(),
            secs(5)
        );
    }

    #[test]
    fn the_server_gets_the_same_settings_and_the_statement_timeout_comes_last() {
        let policy = Policy {
            peer_timeout: PeerTimeout::new(secs(5)).expect("5 s"),
            statement_timeout: Some(secs(60)),
        };
        assert_eq!(
            policy.session_settings(),
            "-c tcp_keepalives_idle=2 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=3 \
             -c tcp_user_timeout=5000 -c statement_timeout=60000"
        );
        assert_eq!(
            policy.peer_timeout.replication_server_settings(),
            "-c tcp_keepalives_idle=2 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=3 \
             -c tcp_user_timeout=0"
        );
        assert_eq!(policy.peer_timeout.amqp_heartbeat(), 3);
        let replication = policy.peer_timeout.tcp_keepalive();
        assert_eq!(replication.user_timeout, Some(secs(5)));
        assert_eq!((replication.idle, replication.interval), (secs(2), secs(1)));
    }

    #[test]
    fn the_options_reach_a_real_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let stream =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let timeout = PeerTimeout::new(secs(7)).expect("7 s");
        timeout.apply(&stream).expect("set");
        let socket = socket2::SockRef::from(&stream);
        assert!(socket.keepalive().expect("SO_KEEPALIVE"));
        assert_eq!(socket.tcp_keepalive_time().expect("idle"), secs(3));
        assert_eq!(socket.tcp_keepalive_interval().expect("interval"), secs(1));
        assert_eq!(socket.tcp_keepalive_retries().expect("count"), 3);
        assert_eq!(
            socket.tcp_user_timeout().expect("user timeout"),
            Some(secs(7))
        );
        let amqp =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        timeout.apply_keepalives(&amqp).expect("set");
        let amqp = socket2::SockRef::from(&amqp);
        assert_eq!(amqp.tcp_keepalive_time().expect("idle"), secs(3));
        assert_eq!(amqp.tcp_user_timeout().expect("user timeout"), None);
    }
}
