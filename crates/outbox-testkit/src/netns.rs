//! Test hosts as Linux network namespaces on a private bridge, and real network partitions
//! between them.
//!
//! ```text
//!   root namespace (the test process)          one namespace per host
//!   bridge obxt<pid><n>  169.254.S.1/24 ──┬── veth ── eth0 169.254.S.10  "rabbit0"
//!   (no uplink, no route, no forwarding)  ├── veth ── eth0 169.254.S.11  "rabbit1"
//!                                         └── …
//! ```
//!
//! - **Addresses**: link-local 169.254.S.0/24 only, S picked so that no address or route of
//!   the root namespace overlaps it (and never 169.254.169, where clouds keep their metadata
//!   service). The hosts have no default route and IPv6 is off inside them: nothing they send
//!   can leave the bridge. The test process reaches every host through the bridge's address.
//! - **Names**: every host's name resolves in every host, through a hosts file per namespace
//!   (`ip netns exec` bind-mounts `/etc/netns/NAME/hosts` over `/etc/hosts`), so a RabbitMQ
//!   node can be `name@rabbit0`. Programs run on a host with [`Host::command`].
//! - **Partitions**: [`Network::cut`] drops every IPv4 packet from one set of hosts to
//!   another (one-way), [`Network::partition`] both ways, until the [`Cut`] is healed or
//!   dropped. The
//!   drop is an nftables rule in the *receiving* host's input hook: the sender sees no error,
//!   no RST and no FIN, exactly as when a network silently loses packets (a drop in the
//!   sender's output hook would fail its writes with EPERM). The kernels here have nf_tables
//!   but no netem, so there is no delay or loss rate, only all or nothing.
//! - **A host that vanishes**: [`Network::vanish`] drops every packet into and out of one
//!   host (its own input and output hooks, loopback excepted) until the [`Vanished`] is
//!   healed or dropped: a powered-off machine, a lost VM or zone, a firewall that drops
//!   everything. Every other host *and the test process* see exactly that: no RST, no FIN,
//!   no ICMP, a connect that times out even to a closed port, and data that is never
//!   acknowledged; only timeouts (TCP's user timeout, keepalives, heartbeats) can tell.
//!   Unlike a cut, which one set of hosts sees and another does not, nobody reaches a
//!   vanished host, not even the test process (a cut never involves it), so what a test
//!   measures is what a peer's own timeouts notice. The processes on the vanished host keep
//!   running, frozen off the network: their sends fail locally (the output drop returns
//!   EPERM to a UDP send; TCP retransmits in vain), nothing of theirs leaves, and once healed
//!   they carry on as a machine back from a long pause would (their peers may long have given
//!   them up). A test stops them, or lets the host's heal bring them back, as it needs.
//! - **Cleanup**: everything is named `obxt<pid>…` (namespaces, the bridge, the root side of
//!   each veth). [`Network::remove`] (also run by `Drop`, and by a watchdog if the test
//!   process dies without either) kills every process left in the namespaces, deletes them,
//!   the bridge and the hosts files. A new network first removes what a crashed run of a dead
//!   process left behind ([`remove_leftovers`]). The nftables tables live inside the
//!   namespaces and go with them.
//!
//! Creating namespaces needs root, `ip` (iproute2) and `nft` (nftables); `scripts/test.sh`
//! installs both. Where that fails, [`Network::create`] panics saying so: a partition test
//! never passes without its partitions.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::{shell_quote, spawn_watchdog, stop_watchdog};

/// What every namespace and interface of the test kit is named with, followed by the pid of
/// the process that made it: how leftovers of a crashed run are recognised.
pub const PREFIX: &str = "obxt";

/// The nftables table each host's drop rules live in.
const NFT_TABLE: &str = "outbox_test";

/// Where `ip netns exec` finds a namespace's own files (`hosts`).
const NETNS_ETC: &str = "/etc/netns";

/// One test host: a network namespace with one address on the network's bridge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    hostname: String,
    netns: String,
    addr: Ipv4Addr,
    subnet: Ipv4Addr,
}

impl Host {
    /// The host's name, resolvable on every host of its network (not in the root namespace).
    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    /// The host's address, reachable from every host and from the test process.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// The name of the host's network namespace.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// The network's link-local subnet, `169.254.S.0/24` (e.g. for pg_hba.conf).
    pub fn subnet_cidr(&self) -> String {
        format!("{}/24", self.subnet)
    }

    /// Runs `f` on a thread that enters this host's network namespace (nothing else shares
    /// it): a socket `f` opens belongs to the host for good, whichever thread uses it later.
    pub fn in_namespace<R: Send>(&self, f: impl FnOnce() -> R + Send) -> std::io::Result<R> {
        let path = format!("/run/netns/{}", self.netns);
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let namespace = std::fs::File::open(&path)?;
                    // SAFETY: setns(2) on a namespace file we opened; it moves this thread
                    // only, which ends right after `f`.
                    let entered = unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) };
                    if entered != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(f())
                })
                .join()
                .unwrap_or_else(|_| {
                    Err(std::io::Error::other(
                        "the thread in the namespace panicked",
                    ))
                })
        })
    }

    /// Whether a UDP datagram from this host reaches `to` within a second: false while a
    /// cut drops this direction.
    pub fn reaches(&self, to: &Host) -> bool {
        let bind = |host: &Host| {
            host.in_namespace(|| UdpSocket::bind(SocketAddrV4::new(host.addr, 0)))
                .and_then(|socket| socket)
        };
        let (Ok(receiver), Ok(sender)) = (bind(to), bind(self)) else {
            return false;
        };
        let Ok(at) = receiver.local_addr() else {
            return false;
        };
        let mut buffer = [0u8; 8];
        if sender.send_to(b"probe", at).is_err() {
            return false;
        }
        // A signal (SIGCHLD of a child another test stopped) interrupts a receive with a
        // timeout whatever SA_RESTART says (signal(7)): receive again for the time left.
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || receiver.set_read_timeout(Some(left)).is_err() {
                return false;
            }
            match receiver.recv(&mut buffer) {
                Ok(_) => return true,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
    }

    /// `program` run on this host: `ip netns exec NETNS program` (same pid, environment and
    /// working directory; the host's hosts file in place of `/etc/hosts`).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.netns]).arg(program);
        command
    }
}

/// One cut made by [`Network::cut`] or [`Network::partition`], in place until it is healed
/// or dropped (so a test that panics mid-partition heals it while unwinding).
#[must_use = "dropping a Cut heals it at once"]
pub struct Cut<'a> {
    network: &'a Network,
    id: u64,
}

impl Cut<'_> {
    /// Undoes the cut (a pair another cut also drops stays dropped); returns once the rules
    /// are gone.
    pub fn heal(self) {}
}

impl Drop for Cut<'_> {
    fn drop(&mut self) {
        self.network.heal_fault(self.id);
    }
}

/// One host made to vanish by [`Network::vanish`], gone until healed or dropped (so a test
/// that panics while the host is gone brings it back while unwinding).
#[must_use = "dropping a Vanished brings the host back at once"]
pub struct Vanished<'a> {
    network: &'a Network,
    id: u64,
}

impl Vanished<'_> {
    /// Brings the host back (unless another [`Network::vanish`] of it still holds); returns
    /// once the rules are gone.
    pub fn heal(self) {}
}

impl Drop for Vanished<'_> {
    fn drop(&mut self) {
        self.network.heal_fault(self.id);
    }
}

/// The hosts of one test, their bridge, and the cuts between them.
pub struct Network {
    bridge: String,
    gateway: Ipv4Addr,
    hosts: Vec<Host>,
    state: Mutex<State>,
}

struct State {
    removed: bool,
    /// The id of the next cut or vanish (one sequence: a guard heals its own id).
    next_fault: u64,
    /// Every active cut by id: the (from, to) host index pairs whose packets are dropped.
    cuts: BTreeMap<u64, Vec<(usize, usize)>>,
    /// Every vanished host by id: the host's index (a host vanished twice stays gone until
    /// both are healed).
    vanished: BTreeMap<u64, usize>,
    /// Each host's rules, as last written to its nftables table.
    applied: Vec<Rules>,
    watchdog: Option<Child>,
}

/// What one host's nftables table drops.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Rules {
    /// Hosts whose packets are dropped on arrival (cuts).
    sources: BTreeSet<usize>,
    /// Everything in and out but loopback (the host vanished).
    vanished: bool,
}

impl Network {
    /// Creates one host per name in `hostnames` (each a valid host name without dots, e.g.
    /// `rabbit0`), on a bridge of their own, after removing what crashed runs left behind.
    /// Panics, saying why and what is needed, where namespaces cannot be made.
    pub fn create(hostnames: &[&str]) -> Network {
        if let Err(e) = preflight() {
            panic!(
                "network namespaces cannot be created here, so the partition tests cannot run \
                 (they fail rather than pass without partitions): {e}. They need root, `ip` \
                 (Debian package iproute2) and `nft` (package nftables); scripts/test.sh \
                 installs both."
            );
        }
        for name in hostnames {
            assert!(
                !name.is_empty()
                    && name.len() <= 40
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "host name {name:?}: use a-z, 0-9 and '-' (at most 40), no dots: RabbitMQ's \
                 short node names take the host part as is"
            );
        }
        remove_leftovers();
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < 26, "at most 26 networks per process");
        let tag = format!(
            "{PREFIX}{}{}",
            std::process::id(),
            char::from(b'a' + n as u8)
        );
        let s = free_subnet().unwrap_or_else(|e| panic!("no free link-local /24: {e}"));
        let subnet = Ipv4Addr::new(169, 254, s, 0);
        let hosts: Vec<Host> = hostnames
            .iter()
            .enumerate()
            .map(|(i, name)| Host {
                hostname: name.to_string(),
                netns: format!("{tag}-{name}"),
                addr: Ipv4Addr::new(169, 254, s, 10 + i as u8),
                subnet,
            })
            .collect();
        assert!(hosts.len() <= 200, "at most 200 hosts");
        let network = Network {
            bridge: tag.clone(),
            gateway: Ipv4Addr::new(169, 254, s, 1),
            state: Mutex::new(State {
                removed: false,
                next_fault: 0,
                cuts: BTreeMap::new(),
                vanished: BTreeMap::new(),
                applied: vec![Rules::default(); hosts.len()],
                // Before anything exists, so that a test process killed now leaves nothing.
                watchdog: spawn_watchdog(&cleanup_script(&tag, &hosts)),
            }),
            hosts,
        };
        // On a failure below, `network`'s Drop removes what was made.
        network.build(&tag);
        eprintln!(
            "harness: network {tag} on {}/24: {}",
            subnet,
            network
                .hosts
                .iter()
                .map(|h| format!("{} {}", h.hostname, h.addr))
                .collect::<Vec<_>>()
                .join(", ")
        );
        network
    }

    fn build(&self, tag: &str) {
        let bridge = &self.bridge;
        ip(&["link", "add", bridge, "type", "bridge"]);
        ip(&[
            "addr",
            "add",
            &format!("{}/24", self.gateway),
            "dev",
            bridge,
        ]);
        ip(&["link", "set", bridge, "up"]);
        let hosts_file = self.hosts_file();
        for (i, host) in self.hosts.iter().enumerate() {
            let ns = host.netns.as_str();
            let veth = format!("{tag}{i}");
            ip(&["netns", "add", ns]);
            ip(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
            ]);
            ip(&["link", "set", &veth, "master", bridge, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            let addr = format!("{}/24", host.addr);
            ip(&["-n", ns, "addr", "add", &addr, "dev", "eth0"]);
            ip(&["-n", ns, "link", "set", "eth0", "up"]);
            // IPv4 only: no fe80:: link-local traffic that a cut would not cover.
            let sysctl = host
                .command("sysctl")
                .args(["-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"])
                .output();
            check("sysctl disable_ipv6", sysctl);
            let dir = PathBuf::from(NETNS_ETC).join(ns);
            std::fs::create_dir_all(&dir).expect("create the namespace's /etc/netns dir");
            std::fs::write(dir.join("hosts"), &hosts_file).expect("write the hosts file");
            if let Err(e) = nft(host, &Rules::default(), &self.hosts) {
                panic!("{e}");
            }
        }
    }

    /// `/etc/hosts` of the root namespace, then every host of the network.
    fn hosts_file(&self) -> String {
        let mut text = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        text += "\n# outbox-relay test hosts\n";
        for host in &self.hosts {
            text += &format!("{} {}\n", host.addr, host.hostname);
        }
        text
    }

    /// Every host, in the order of [`Network::create`]'s names.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The host named `hostname`; panics if there is none.
    pub fn host(&self, hostname: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.hostname == hostname)
            .unwrap_or_else(|| panic!("no test host named {hostname}"))
    }

    /// The test process's own address on the bridge (the root namespace's side).
    pub fn gateway(&self) -> Ipv4Addr {
        self.gateway
    }

    /// Drops every packet from the hosts `from` to the hosts `to` (and nothing the other way)
    /// until the cut is healed. Returns once the rules are in place.
    pub fn cut(&self, from: &[&Host], to: &[&Host]) -> Cut<'_> {
        self.add_cut(self.pairs(from, to))
    }

    /// Drops every packet between the hosts `a` and the hosts `b`, both ways.
    pub fn partition(&self, a: &[&Host], b: &[&Host]) -> Cut<'_> {
        let mut pairs = self.pairs(a, b);
        pairs.extend(self.pairs(b, a));
        self.add_cut(pairs)
    }

    /// The (from, to) index pairs of every host of `from` and every other host of `to`.
    fn pairs(&self, from: &[&Host], to: &[&Host]) -> Vec<(usize, usize)> {
        from.iter()
            .flat_map(|a| to.iter().map(move |b| (self.index(a), self.index(b))))
            .filter(|(a, b)| a != b)
            .collect()
    }

    fn add_cut(&self, pairs: Vec<(usize, usize)>) -> Cut<'_> {
        let id = self.add_fault(|state, id| {
            state.cuts.insert(id, pairs);
        });
        Cut { network: self, id }
    }

    /// Makes `host` vanish: every packet into and out of it is dropped (loopback excepted)
    /// until the guard is healed or dropped, so every other host and the test process see a
    /// machine that is silently gone (see the module documentation). Returns once the rules
    /// are in place.
    pub fn vanish(&self, host: &Host) -> Vanished<'_> {
        let index = self.index(host);
        let id = self.add_fault(|state, id| {
            state.vanished.insert(id, index);
        });
        Vanished { network: self, id }
    }

    /// Records a new fault with `add` under a fresh id and writes the rules; the id.
    fn add_fault(&self, add: impl FnOnce(&mut State, u64)) -> u64 {
        let mut state = self.lock();
        assert!(!state.removed, "the network was removed");
        let id = state.next_fault;
        state.next_fault += 1;
        add(&mut state, id);
        if let Err(e) = self.apply(&mut state) {
            panic!("{e}");
        }
        id
    }

    fn heal_fault(&self, id: u64) {
        let mut state = self.lock();
        let cut = state.cuts.remove(&id).is_some();
        let vanished = state.vanished.remove(&id).is_some();
        if !(cut || vanished) || state.removed {
            return;
        }
        match self.apply(&mut state) {
            Ok(()) => {}
            // Healing while a test unwinds: a second panic would abort the process.
            Err(e) if std::thread::panicking() => eprintln!("harness: healing a fault: {e}"),
            Err(e) => panic!("{e}"),
        }
    }

    /// Whether any cut is in place, or any host vanished.
    pub fn is_cut(&self) -> bool {
        let state = self.lock();
        !state.cuts.is_empty() || !state.vanished.is_empty()
    }

    /// Kills every process left on the hosts and removes the namespaces, the bridge and the
    /// hosts files; idempotent. `Drop` calls it.
    pub fn remove(&self) {
        let mut state = self.lock();
        if state.removed {
            return;
        }
        state.removed = true;
        let namespaces: Vec<&str> = self.hosts.iter().map(|h| h.netns.as_str()).collect();
        remove_namespaces(&namespaces);
        let _ = run_quiet(Command::new("ip").args(["link", "delete", &self.bridge]));
        let _ = std::fs::remove_dir(NETNS_ETC);
        stop_watchdog(state.watchdog.take());
    }

    fn index(&self, host: &Host) -> usize {
        self.hosts
            .iter()
            .position(|h| h == host)
            .unwrap_or_else(|| panic!("{} is not a host of this network", host.hostname))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the drop rules of every host whose rules changed.
    fn apply(&self, state: &mut State) -> Result<(), String> {
        let mut wanted = vec![Rules::default(); self.hosts.len()];
        for &(from, to) in state.cuts.values().flatten() {
            wanted[to].sources.insert(from);
        }
        for &host in state.vanished.values() {
            wanted[host].vanished = true;
        }
        for (i, rules) in wanted.into_iter().enumerate() {
            if state.applied[i] != rules {
                nft(&self.hosts[i], &rules, &self.hosts)?;
                state.applied[i] = rules;
            }
        }
        Ok(())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Bytes a TCP socket has queued that its peer has not acknowledged (sent or not yet sent:
/// SIOCOUTQ): how a test sees that a peer went silent, since nothing fails on the socket.
pub fn unacknowledged(stream: &std::net::TcpStream) -> usize {
    let mut queued: libc::c_int = 0;
    // SAFETY: ioctl(2) SIOCOUTQ (TIOCOUTQ) on a TCP socket the caller owns, into a c_int.
    let done = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
    assert_eq!(done, 0, "SIOCOUTQ: {}", std::io::Error::last_os_error());
    usize::try_from(queued).unwrap_or(0)
}

/// Replaces `host`'s drop rules, atomically (one `nft -f` transaction): packets from the
/// hosts `rules.sources` are dropped on arrival; a vanished host drops everything in and out
/// but its loopback (its own processes still talk to each other over 127.0.0.1).
fn nft(host: &Host, rules: &Rules, hosts: &[Host]) -> Result<(), String> {
    let mut script = format!(
        "add table inet {NFT_TABLE}\nflush table inet {NFT_TABLE}\n\
         table inet {NFT_TABLE} {{\n  chain input {{\n    \
         type filter hook input priority filter; policy accept;\n"
    );
    if rules.vanished {
        script += "    iif \"lo\" accept\n    drop\n";
    }
    if !rules.sources.is_empty() {
        let sources = &rules.sources;
        let addrs: Vec<String> = sources.iter().map(|&i| hosts[i].addr.to_string()).collect();
        script += &format!("    ip saddr {{ {} }} drop\n", addrs.join(", "));
    }
    script += "  }\n  chain output {\n    \
               type filter hook output priority filter; policy accept;\n";
    if rules.vanished {
        script += "    oif \"lo\" accept\n    drop\n";
    }
    script += "  }\n}\n";
    let what = format!("nft -f on {}", host.hostname);
    let mut child = host
        .command("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what} could not run: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("{what}: writing the script: {e}"))?;
    }
    match child.wait_with_output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!("{what} failed: {}", output_text(&out))),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// Why namespaces cannot be made here, if they cannot.
fn preflight() -> Result<(), String> {
    if !super::is_root() {
        return Err("the test does not run as root".into());
    }
    for (tool, args) in [("ip", ["-V"]), ("nft", ["-v"])] {
        match Command::new(tool).args(args).output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => return Err(format!("`{tool}` failed: {}", output_text(&out))),
            Err(e) => return Err(format!("`{tool}` cannot be run ({e})")),
        }
    }
    // A namespace made and removed at once: `ip netns add` fails in containers without
    // CAP_SYS_ADMIN.
    let probe = format!("{PREFIX}{}probe", std::process::id());
    let added = Command::new("ip").args(["netns", "add", &probe]).output();
    let added = added.map_err(|e| format!("ip netns add: {e}"))?;
    if !added.status.success() {
        return Err(format!("ip netns add: {}", output_text(&added)));
    }
    let _ = run_quiet(Command::new("ip").args(["netns", "delete", &probe]));
    Ok(())
}

/// A third octet S for 169.254.S.0/24 that no address or route of the root namespace
/// touches, starting from one derived from the pid (so that two test processes differ).
fn free_subnet() -> Result<u8, String> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .map_err(|e| e.to_string())?;
    let routes = Command::new("ip")
        .args(["-4", "route", "show", "table", "all"])
        .output()
        .map_err(|e| e.to_string())?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&routes.stdout)
    );
    // Any 169.254.0.0/16 route (zeroconf) covers every S: refuse rather than shadow it.
    if text.contains("169.254.0.0/16") {
        return Err("the root namespace routes 169.254.0.0/16".into());
    }
    let start = (std::process::id() % 150) as u8 + 20;
    (0..150u8)
        .map(|k| 20 + (start - 20 + k) % 150)
        .find(|s| *s != 169 && !text.contains(&format!("169.254.{s}.")))
        .ok_or_else(|| "every candidate is in use".to_string())
}

/// Removes the namespaces, bridges and hosts files of test processes that are gone (a run
/// that crashed, or was killed before its watchdog noticed).
pub fn remove_leftovers() {
    let dead = |name: &str| {
        let Some(rest) = name.strip_prefix(PREFIX) else {
            return false;
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(pid) = digits.parse::<i32>() else {
            return false;
        };
        pid != std::process::id() as i32 && !super::procfs::process_alive(pid)
    };
    let listed = Command::new("ip").args(["netns", "list"]).output();
    let namespaces: Vec<String> = listed
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| dead(name))
        .map(str::to_string)
        .collect();
    let leftover_etc: Vec<String> = std::fs::read_dir(NETNS_ETC)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| dead(name))
        .collect();
    if !namespaces.is_empty() || !leftover_etc.is_empty() {
        eprintln!("harness: removing network namespaces of dead test runs: {namespaces:?}");
    }
    remove_namespaces(&namespaces.iter().map(String::as_str).collect::<Vec<_>>());
    for name in leftover_etc {
        let _ = std::fs::remove_dir_all(PathBuf::from(NETNS_ETC).join(name));
    }
    let links = Command::new("ip").args(["-o", "link", "show"]).output();
    let links = links
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default();
    for line in links.lines() {
        // "7: obxt1234a0@if2: <…"
        let Some(name) = line.split(": ").nth(1) else {
            continue;
        };
        let name = name.split('@').next().unwrap_or(name);
        if dead(name) {
            let _ = run_quiet(Command::new("ip").args(["link", "delete", name]));
        }
    }
    let _ = std::fs::remove_dir(NETNS_ETC);
}

/// Kills every process in `namespaces`, waits for them to go, and deletes the namespaces and
/// their `/etc/netns` dirs.
fn remove_namespaces(namespaces: &[&str]) {
    let pids_in = |ns: &str| -> Vec<i32> {
        Command::new("ip")
            .args(["netns", "pids", ns])
            .output()
            .map(|out| {
                String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    for ns in namespaces {
        for pid in pids_in(ns) {
            // SAFETY: kill(2) of a process inside a namespace this harness made.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    super::poll_until(Duration::from_secs(10), Duration::from_millis(20), || {
        namespaces.iter().all(|ns| {
            pids_in(ns)
                .into_iter()
                .all(|pid| !super::procfs::process_alive(pid))
        })
    });
    for ns in namespaces {
        let _ = run_quiet(Command::new("ip").args(["netns", "delete", ns]));
        let _ = std::fs::remove_dir_all(PathBuf::from(NETNS_ETC).join(ns));
    }
}

/// What the watchdog runs if the test process dies without removing the network.
fn cleanup_script(bridge: &str, hosts: &[Host]) -> String {
    let namespaces: Vec<String> = hosts.iter().map(|h| shell_quote(&h.netns)).collect();
    let namespaces = namespaces.join(" ");
    format!(
        "for ns in {namespaces}; do for p in $(ip netns pids $ns 2>/dev/null); do kill -9 $p; \
         done; done; sleep 1; for ns in {namespaces}; do ip netns delete $ns; \
         rm -rf {NETNS_ETC}/$ns; done; ip link delete {bridge}; rmdir {NETNS_ETC}",
        bridge = shell_quote(bridge),
    )
}

/// `ip args…`; panics with its output if it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output();
    check(&format!("ip {}", args.join(" ")), out);
}

fn check(what: &str, out: std::io::Result<Output>) {
    match out {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!("{what} failed: {}", output_text(&out)),
        Err(e) => panic!("{what} could not run: {e}"),
    }
}

fn run_quiet(command: &mut Command) -> std::io::Result<Output> {
    command.stdin(Stdio::null()).output()
}

fn output_text(out: &Output) -> String {
    format!(
        "{} {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
