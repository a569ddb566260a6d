//! Pod networking with iproute2: one bridge per run with a host-side address in a free
//! 10.200-10.250.x.0/24, and per pod a network namespace joined to it by a veth pair. Every
//! name starts with `m3r<run id>` so leftovers of dead runs can be found and removed.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hasher};
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};

/// Every namespace, link and folder this runner creates starts with this.
pub const PREFIX: &str = "m3r";
const RUN_ID_LEN: usize = 5;

/// Fails with a clear message when namespaces cannot be created here.
pub fn require_root() -> anyhow::Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next().map(str::to_owned));
    if uid.as_deref() != Some("0") {
        bail!(
            "the local cluster's pod runner needs root: it creates network and mount \
             namespaces for pods (run it as root)"
        );
    }
    run(Command::new("ip").arg("-V"))
        .context("the pod runner needs iproute2's `ip` for pod networks")?;
    run(Command::new("unshare").arg("--version"))
        .context("the pod runner needs util-linux's `unshare` for mount namespaces")?;
    Ok(())
}

/// Runs a command, failing with its stderr.
pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.write_u32(std::process::id());
    h.finish()
}

pub(crate) fn random_run_id() -> String {
    format!("{:016x}", random_u64())[..RUN_ID_LEN].to_owned()
}

/// `pid:starttime`: identifies a process even after its pid is reused.
pub(crate) fn owner_token(pid: u32) -> String {
    format!("{pid}:{}", start_time(pid).unwrap_or_default())
}

fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields after it are plain.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19).map(str::to_owned)
}

fn run_is_alive(run_id: &str) -> bool {
    let owner = std::env::temp_dir()
        .join(format!("{PREFIX}{run_id}"))
        .join("owner");
    let Ok(token) = std::fs::read_to_string(owner) else {
        return false;
    };
    let Some(pid) = token.split(':').next().and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    owner_token(pid) == token
}

fn run_id_of(name: &str) -> Option<&str> {
    let rest = name.strip_prefix(PREFIX)?;
    rest.get(..RUN_ID_LEN)
        .filter(|id| id.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Removes the namespaces (and their processes), links and folders of runs whose owning
/// process is gone. Best effort: what cannot be removed is left for the next run.
pub fn cleanup_stale() {
    for ns in netns_names() {
        if run_id_of(&ns).is_some_and(|id| !run_is_alive(id)) {
            kill_netns_processes(&ns);
            let _ = run(Command::new("ip").args(["netns", "del", &ns]));
        }
    }
    for link in link_names() {
        if run_id_of(&link).is_some_and(|id| !run_is_alive(id)) {
            let _ = run(Command::new("ip").args(["link", "del", &link]));
        }
    }
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.len() == PREFIX.len() + RUN_ID_LEN
                && run_id_of(&name).is_some_and(|id| !run_is_alive(id))
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Names of all network namespaces `ip netns` knows.
pub fn netns_names() -> Vec<String> {
    run(Command::new("ip").args(["netns", "list"]))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// Names of all links on the host.
pub fn link_names() -> Vec<String> {
    run(Command::new("ip").args(["-o", "link", "show"]))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or_default().to_owned())
        .collect()
}

fn kill_netns_processes(ns: &str) {
    let pids = run(Command::new("ip").args(["netns", "pids", ns])).unwrap_or_default();
    for pid in pids
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        if let Some(pid) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// The `/24`s already routed on this machine, as their first three octets.
fn routed_prefixes() -> Vec<Ipv4Addr> {
    run(Command::new("ip").args(["-4", "route", "show", "table", "all"]))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|dst| {
            let (addr, len) = dst.split_once('/').unwrap_or((dst, "32"));
            Some((addr.parse::<Ipv4Addr>().ok()?, len.parse::<u32>().ok()?))
        })
        .flat_map(|(addr, len)| {
            // A route shorter than /24 covers many of our candidates: expand only those in 10/8.
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            let base = u32::from(addr) & mask;
            let count = if len >= 24 {
                1
            } else {
                1u32 << (24 - len).min(16)
            };
            (0..count).map(move |i| Ipv4Addr::from((base & 0xffff_ff00) + (i << 8)))
        })
        .collect()
}

/// This run's bridge. Dropping it deletes the bridge.
pub struct Network {
    shared: Arc<Shared>,
}

struct Shared {
    prefix: String,
    bridge: String,
    host_ip: Ipv4Addr,
    state: Mutex<State>,
}

struct State {
    next_index: u32,
    /// Last octets in use: pods take the lowest free one, Service virtual IPs the highest.
    used: BTreeSet<u8>,
    /// The virtual IP of each Service (namespace, name), by last octet.
    services: BTreeMap<(String, String), u8>,
}

impl Network {
    pub(crate) fn create(run_id: &str) -> anyhow::Result<Self> {
        let prefix = format!("{PREFIX}{run_id}");
        let bridge = format!("{prefix}br");
        // Picking a subnet and routing it is one step for the runs of this process (tests
        // start several at once), so two runs never pick the same /24.
        static PICKING: Mutex<()> = Mutex::new(());
        let _picking = PICKING.lock().unwrap_or_else(|e| e.into_inner());
        let routed = routed_prefixes();
        let mut seed = random_u64();
        let mut subnet = None;
        for _ in 0..200 {
            let b = 200 + (seed % 51) as u8;
            let c = ((seed >> 8) % 256) as u8;
            seed = seed.rotate_left(17) ^ random_u64();
            let candidate = Ipv4Addr::new(10, b, c, 0);
            if !routed.contains(&candidate) {
                subnet = Some(candidate);
                break;
            }
        }
        let Some(subnet) = subnet else {
            bail!("no free /24 in 10.200.0.0-10.250.255.0 for the pod network");
        };
        let [a, b, c, _] = subnet.octets();
        let host_ip = Ipv4Addr::new(a, b, c, 1);
        run(Command::new("ip").args(["link", "add", &bridge, "type", "bridge"]))?;
        let network = Self {
            shared: Arc::new(Shared {
                prefix,
                bridge: bridge.clone(),
                host_ip,
                state: Mutex::new(State {
                    next_index: 0,
                    used: BTreeSet::new(),
                    services: BTreeMap::new(),
                }),
            }),
        };
        // A bridge without an address of its own takes the lowest MAC among its ports, so
        // it would change whenever a pod joins or leaves, and pods would keep sending what
        // is meant for the host (the API server, Service virtual IPs) to the old MAC until
        // their ARP entry expires. A fixed, locally administered MAC keeps the host's.
        let mac = format!("02:6d:33:{a:02x}:{b:02x}:{c:02x}");
        run(Command::new("ip").args(["link", "set", &bridge, "address", &mac]))?;
        run(Command::new("ip").args(["addr", "add", &format!("{host_ip}/24"), "dev", &bridge]))?;
        run(Command::new("ip").args(["link", "set", &bridge, "up"]))?;
        Ok(network)
    }

    pub fn host_ip(&self) -> Ipv4Addr {
        self.shared.host_ip
    }

    pub fn bridge(&self) -> &str {
        &self.shared.bridge
    }

    /// The virtual IP of Service `namespace/name`, if it has one.
    pub fn service_ip(&self, namespace: &str, name: &str) -> Option<Ipv4Addr> {
        let state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        let octet = *state
            .services
            .get(&(namespace.to_owned(), name.to_owned()))?;
        let [a, b, c, _] = self.shared.host_ip.octets();
        Some(Ipv4Addr::new(a, b, c, octet))
    }

    /// Gives Service `namespace/name` a virtual IP: a free address of the pod network, added
    /// to the bridge so pods (through their default route) and the host reach what listens
    /// on it. The same address while the Service lives; removed with the bridge.
    pub fn add_service_ip(&self, namespace: &str, name: &str) -> anyhow::Result<Ipv4Addr> {
        if let Some(ip) = self.service_ip(namespace, name) {
            return Ok(ip);
        }
        let octet = {
            let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            let Some(octet) = (2..=254u8).rev().find(|o| !state.used.contains(o)) else {
                bail!("the pod network is full (253 pods and Services)");
            };
            state.used.insert(octet);
            octet
        };
        let [a, b, c, _] = self.shared.host_ip.octets();
        let ip = Ipv4Addr::new(a, b, c, octet);
        let added = run(Command::new("ip").args([
            "addr",
            "add",
            &format!("{ip}/32"),
            "dev",
            &self.shared.bridge,
        ]));
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = added {
            state.used.remove(&octet);
            return Err(e.context(format!(
                "adding the virtual IP of service {namespace}/{name}"
            )));
        }
        state
            .services
            .insert((namespace.to_owned(), name.to_owned()), octet);
        Ok(ip)
    }

    /// Takes Service `namespace/name`'s virtual IP off the bridge and frees it.
    pub fn remove_service_ip(&self, namespace: &str, name: &str) {
        let Some(ip) = self.service_ip(namespace, name) else {
            return;
        };
        let _ = run(Command::new("ip").args([
            "addr",
            "del",
            &format!("{ip}/32"),
            "dev",
            &self.shared.bridge,
        ]));
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(octet) = state
            .services
            .remove(&(namespace.to_owned(), name.to_owned()))
        {
            state.used.remove(&octet);
        }
    }

    /// Creates a network namespace with its own address on the bridge and loopback up.
    pub fn attach(&self) -> anyhow::Result<PodNetwork> {
        let (index, host_octet) = {
            let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            let Some(octet) = (2..=254u8).find(|o| !state.used.contains(o)) else {
                bail!("the pod network is full (253 pods)");
            };
            state.used.insert(octet);
            state.next_index += 1;
            (state.next_index, octet)
        };
        let [a, b, c, _] = self.shared.host_ip.octets();
        let ip = Ipv4Addr::new(a, b, c, host_octet);
        let p = &self.shared.prefix;
        let pod = PodNetwork {
            netns: format!("{p}-{index}"),
            host_veth: format!("{p}h{index}"),
            ip,
            octet: host_octet,
            shared: self.shared.clone(),
        };
        pod.setup()?;
        Ok(pod)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let _ = run(Command::new("ip").args(["link", "del", &self.shared.bridge]));
    }
}

/// A pod's network namespace and veth. Dropping it kills whatever still runs inside the
/// namespace, then deletes the namespace (which deletes the veth pair).
pub struct PodNetwork {
    netns: String,
    host_veth: String,
    ip: Ipv4Addr,
    octet: u8,
    shared: Arc<Shared>,
}

impl PodNetwork {
    fn setup(&self) -> anyhow::Result<()> {
        let ns = &self.netns;
        let peer = format!(
            "{}p{}",
            self.shared.prefix,
            &self.host_veth[self.shared.prefix.len() + 1..]
        );
        let in_ns = |args: &[&str]| -> anyhow::Result<String> {
            run(Command::new("ip").args(["-n", ns]).args(args))
        };
        run(Command::new("ip").args(["netns", "add", ns]))?;
        run(Command::new("ip").args([
            "link",
            "add",
            &self.host_veth,
            "type",
            "veth",
            "peer",
            "name",
            &peer,
            "netns",
            ns,
        ]))?;
        run(Command::new("ip").args([
            "link",
            "set",
            &self.host_veth,
            "master",
            &self.shared.bridge,
            "up",
        ]))?;
        in_ns(&["link", "set", &peer, "name", "eth0"])?;
        in_ns(&["addr", "add", &format!("{}/24", self.ip), "dev", "eth0"])?;
        in_ns(&["link", "set", "eth0", "up"])?;
        in_ns(&["link", "set", "lo", "up"])?;
        in_ns(&[
            "route",
            "add",
            "default",
            "via",
            &self.shared.host_ip.to_string(),
        ])?;
        Ok(())
    }

    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The namespace's name under `/run/netns`.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    pub fn netns_path(&self) -> String {
        format!("/run/netns/{}", self.netns)
    }
}

impl Drop for PodNetwork {
    fn drop(&mut self) {
        kill_netns_processes(&self.netns);
        let _ = run(Command::new("ip").args(["netns", "del", &self.netns]));
        let _ = run(Command::new("ip").args(["link", "del", &self.host_veth]));
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        state.used.remove(&self.octet);
    }
}

/// A TCP connection to `127.0.0.1:port` inside the network namespace at `netns` (the pod's
/// loopback, as the kubelet's port-forward reaches it). The socket is made on a thread that
/// enters the namespace and ends with it; the socket stays in that namespace.
pub fn connect_in_netns(netns: &str, port: u16) -> std::io::Result<std::net::TcpStream> {
    let netns = netns.to_owned();
    std::thread::spawn(move || {
        use std::os::fd::AsFd;
        let file = std::fs::File::open(&netns)?;
        rustix::thread::move_into_link_name_space(
            file.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )?;
        std::net::TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            std::time::Duration::from_secs(5),
        )
    })
    .join()
    .map_err(|_| {
        std::io::Error::other("the thread entering the pod's network namespace panicked")
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_read_from_names() {
        assert_eq!(run_id_of("m3rab12fbr"), Some("ab12f"));
        assert_eq!(run_id_of("m3rab12f-3"), Some("ab12f"));
        assert_eq!(run_id_of("m3rxyz"), None);
        assert_eq!(run_id_of("eth0"), None);
    }

    #[test]
    fn this_process_owns_a_live_token() {
        let token = owner_token(std::process::id());
        assert!(token.starts_with(&format!("{}:", std::process::id())));
        assert_ne!(token.split(':').nth(1), Some(""));
    }
}
