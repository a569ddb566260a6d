//! The cell Envoy judges in. `marin3r judge-sandbox` confines itself, then becomes Envoy:
//! limits on CPU time, memory, open files and file writes; Landlock, so that Envoy reads only
//! its own binary, the system libraries and `/proc` and `/sys` (never a Secret, a key, a token,
//! or another judge's input) and opens no TCP connection; seccomp, so that it starts no
//! process, connects nowhere and reaches no kernel interface a validator has no use for. Every
//! one of these is granted to unprivileged processes, in a container too, so the discovery
//! pod needs no capability for it (see docs/architecture.md, "The Envoy judge").
//!
//! Confining happens in a process of its own, just before `exec`, so that no unsafe code is
//! needed and the parent's threads are never touched.

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};
use rustix::process::{Resource, Rlimit, setrlimit};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

/// The exit code of `judge-sandbox` when the sandbox could not be entered (as `env` and
/// `chroot` use 125 for their own failures): nothing of Envoy ran.
pub const CANNOT_CONFINE: u8 = 125;

/// The Landlock ABI asked for: v6 adds the scopes (abstract sockets, signals); older kernels
/// get what they support (best effort), which `judge-sandbox --check` reports.
const LANDLOCK: ABI = ABI::V6;

/// What the confined Envoy may read (and run, for the libraries): the dynamic loader's files
/// and the system's libraries, and what Envoy reads of the machine at start (CPU count and
/// cgroup quota). Of `/proc`, only its own `/proc/<pid>` (see [`confine`]): not another
/// judge's command line or files.
const READABLE: [&str; 8] = [
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    "/usr/share/locale",
    "/etc/ld.so.cache",
    "/sys/devices/system/cpu",
    "/sys/fs/cgroup",
];

/// Written to by Envoy for access logs the judge points there (see `code.rs`).
const WRITABLE: [&str; 1] = ["/dev/null"];

/// The limits one Envoy run lives under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// CPU time; the kernel ends the process past it, whatever the wall clock says.
    pub cpu_seconds: u64,
    /// Address space. Envoy's allocator reserves about 3.5 GiB of it up front (most never
    /// touched), so this caps a runaway, not the resident size.
    pub address_space: u64,
    /// Descriptors.
    pub open_files: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            cpu_seconds: 10,
            address_space: 6 << 30,
            open_files: 256,
        }
    }
}

impl Limits {
    /// As `judge-sandbox` arguments.
    pub fn args(&self) -> Vec<OsString> {
        [
            format!("--cpu-seconds={}", self.cpu_seconds),
            format!("--address-space={}", self.address_space),
            format!("--open-files={}", self.open_files),
        ]
        .into_iter()
        .map(OsString::from)
        .collect()
    }
}

/// Why the sandbox could not be entered. Nothing runs then.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("setting the limit on {what}: {source}")]
    Limit {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("Landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("seccomp: {0}")]
    Seccomp(#[from] seccompiler::Error),
    #[error("seccomp filter: {0}")]
    SeccompFilter(#[from] seccompiler::BackendError),
    #[error("running {path}: {source}")]
    Exec {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// How much of the sandbox the kernel enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforced {
    /// Every Landlock right asked for.
    Fully,
    /// A kernel older than the ABI asked for: what it knows (files always; TCP from 6.7).
    Partly,
    /// No Landlock at all: limits and seccomp only.
    NoLandlock,
}

/// Confines this process and executes `envoy` with `args`, `-c config` and an empty
/// environment; `config` is the one file besides its own Envoy may read. Returns only when
/// something failed, and then nothing of Envoy ran.
pub fn exec(envoy: &Path, args: &[OsString], config: &Path, limits: &Limits) -> SandboxError {
    if let Err(e) = confine(envoy, Some(config), limits) {
        return e;
    }
    let source = std::process::Command::new(envoy)
        .args(args)
        .arg("-c")
        .arg(config)
        .env_clear()
        .exec();
    SandboxError::Exec {
        path: envoy.to_owned(),
        source,
    }
}

/// Confines this thread (and what it executes) as [`exec`] does, and says how much of it the
/// kernel enforces.
pub fn confine(
    envoy: &Path,
    config: Option<&Path>,
    limits: &Limits,
) -> Result<Enforced, SandboxError> {
    set_limits(limits)?;
    let enforced = restrict_files_and_network(envoy, config)?;
    for filter in filters()? {
        seccompiler::apply_filter(&filter)?;
    }
    Ok(enforced)
}

fn set_limits(limits: &Limits) -> Result<(), SandboxError> {
    let set = |what, resource, soft: u64, hard: u64| {
        setrlimit(
            resource,
            Rlimit {
                current: Some(soft),
                maximum: Some(hard),
            },
        )
        .map_err(|e| SandboxError::Limit {
            what,
            source: e.into(),
        })
    };
    // The soft CPU limit sends SIGXCPU, the hard one a second later SIGKILL.
    set(
        "CPU time",
        Resource::Cpu,
        limits.cpu_seconds,
        limits.cpu_seconds + 1,
    )?;
    set(
        "address space",
        Resource::As,
        limits.address_space,
        limits.address_space,
    )?;
    set(
        "open files",
        Resource::Nofile,
        limits.open_files,
        limits.open_files,
    )?;
    // No regular file grows: a write past 0 bytes is SIGXFSZ. Access logs go to /dev/null.
    set("file size", Resource::Fsize, 0, 0)?;
    set("core dumps", Resource::Core, 0, 0)?;
    Ok(())
}

fn restrict_files_and_network(
    envoy: &Path,
    config: Option<&Path>,
) -> Result<Enforced, SandboxError> {
    let abi = LANDLOCK;
    let existing = |paths: &[&str]| -> Vec<PathBuf> {
        paths
            .iter()
            .map(PathBuf::from)
            .filter(|p| p.exists())
            .collect()
    };
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))?
        .handle_access(AccessNet::from_all(abi))?
        .scope(Scope::from_all(abi))?
        .create()?
        .no_new_privs(true)
        .add_rules(path_beneath_rules(
            existing(&READABLE),
            AccessFs::from_read(abi),
        ))?
        .add_rules(path_beneath_rules([envoy], AccessFs::from_read(abi)))?
        .add_rules(path_beneath_rules(config, AccessFs::ReadFile))?
        // This process's pid is Envoy's once it executes: its own /proc, nobody else's.
        .add_rules(path_beneath_rules(
            [format!("/proc/{}", std::process::id())],
            AccessFs::ReadFile | AccessFs::ReadDir,
        ))?
        .add_rules(path_beneath_rules(
            existing(&WRITABLE),
            AccessFs::ReadFile | AccessFs::WriteFile,
        ))?
        .restrict_self()?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Enforced::Fully,
        RulesetStatus::PartiallyEnforced => Enforced::Partly,
        _ => Enforced::NoLandlock,
    })
}

/// The seccomp filters, in the order they are installed: what no validator needs is refused
/// with EPERM; `clone3` answers ENOSYS, so that the C library starts threads with `clone`,
/// whose flags the first filter can read (a new process is refused, a thread is not).
fn filters() -> Result<Vec<BpfProgram>, SandboxError> {
    let arch = || std::env::consts::ARCH.try_into();
    let refused = SeccompFilter::new(
        refused_calls()?,
        SeccompAction::Allow,
        SeccompAction::Errno(errno(libc::EPERM)),
        arch()?,
    )?;
    let clone3 = SeccompFilter::new(
        [(libc::SYS_clone3, vec![])].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(errno(libc::ENOSYS)),
        arch()?,
    )?;
    Ok(vec![refused.try_into()?, clone3.try_into()?])
}

fn errno(code: libc::c_int) -> u32 {
    code.unsigned_abs()
}

/// What no validator needs, refused whatever the arguments: starting a process, accepting or
/// making a connection, reading or writing another process, mounting, namespaces, loading
/// kernel code, io_uring (whose operations seccomp cannot see), keys, and the like.
#[rustfmt::skip]
const ALWAYS: &[libc::c_long] = &[
    #[cfg(target_arch = "x86_64")] libc::SYS_fork,
    #[cfg(target_arch = "x86_64")] libc::SYS_vfork,
    #[cfg(target_arch = "x86_64")] libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")] libc::SYS_ioperm,
    libc::SYS_connect, libc::SYS_listen, libc::SYS_accept, libc::SYS_accept4,
    libc::SYS_ptrace, libc::SYS_process_vm_readv, libc::SYS_process_vm_writev,
    libc::SYS_pidfd_open, libc::SYS_pidfd_getfd, libc::SYS_kcmp,
    libc::SYS_mount, libc::SYS_umount2, libc::SYS_pivot_root, libc::SYS_chroot,
    libc::SYS_open_tree, libc::SYS_move_mount, libc::SYS_fsopen, libc::SYS_fsconfig,
    libc::SYS_fsmount, libc::SYS_fspick, libc::SYS_mount_setattr,
    libc::SYS_unshare, libc::SYS_setns,
    libc::SYS_bpf, libc::SYS_perf_event_open, libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup, libc::SYS_io_uring_enter, libc::SYS_io_uring_register,
    libc::SYS_keyctl, libc::SYS_add_key, libc::SYS_request_key,
    libc::SYS_kexec_load, libc::SYS_init_module, libc::SYS_finit_module,
    libc::SYS_delete_module, libc::SYS_reboot, libc::SYS_swapon, libc::SYS_swapoff,
    libc::SYS_acct, libc::SYS_quotactl,
];

/// Each system call refused, with the conditions under which (none: always).
fn refused_calls() -> Result<std::collections::BTreeMap<i64, Vec<SeccompRule>>, SandboxError> {
    let arg = |index, op, value: libc::c_int| {
        SeccompCondition::new(
            index,
            SeccompCmpArgLen::Dword,
            op,
            u64::from(value.unsigned_abs()),
        )
    };
    let masked = |index, mask: libc::c_int, value: libc::c_int| {
        let mask = u64::from(mask.unsigned_abs());
        arg(index, SeccompCmpOp::MaskedEq(mask), value)
    };
    let mut refused: std::collections::BTreeMap<i64, Vec<SeccompRule>> =
        ALWAYS.iter().map(|call| (*call, vec![])).collect();
    // A new process (no CLONE_THREAD): none. Threads are how Envoy works.
    refused.insert(
        libc::SYS_clone,
        vec![SeccompRule::new(vec![masked(0, libc::CLONE_THREAD, 0)?])?],
    );
    // Sockets: netlink (Envoy lists the interfaces) and TCP (it probes IPv4 and IPv6
    // support), which Landlock keeps from binding or connecting, and `connect` is refused
    // anyway. No UDP, raw, packet or Unix socket, and no netlink but routing.
    let mut socket = vec![SeccompRule::new(vec![
        arg(0, SeccompCmpOp::Ne, libc::AF_NETLINK)?,
        arg(0, SeccompCmpOp::Ne, libc::AF_INET)?,
        arg(0, SeccompCmpOp::Ne, libc::AF_INET6)?,
    ])?];
    for family in [libc::AF_INET, libc::AF_INET6] {
        for kind in [libc::SOCK_DGRAM, libc::SOCK_RAW, libc::SOCK_SEQPACKET] {
            socket.push(SeccompRule::new(vec![
                arg(0, SeccompCmpOp::Eq, family)?,
                masked(1, 0xf, kind)?,
            ])?);
        }
    }
    socket.push(SeccompRule::new(vec![
        arg(0, SeccompCmpOp::Eq, libc::AF_NETLINK)?,
        arg(2, SeccompCmpOp::Ne, libc::NETLINK_ROUTE)?,
    ])?);
    refused.insert(libc::SYS_socket, socket);
    // TCP Fast Open connects through sendto (flags: argument 3) and sendmsg (argument 2).
    for (call, flags) in [(libc::SYS_sendto, 3), (libc::SYS_sendmsg, 2)] {
        refused.insert(
            call,
            vec![SeccompRule::new(vec![masked(
                flags,
                libc::MSG_FASTOPEN,
                libc::MSG_FASTOPEN,
            )?])?],
        );
    }
    Ok(refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_compile_for_this_machine() {
        let filters = filters().unwrap();
        assert_eq!(filters.len(), 2);
        assert!(filters.iter().all(|f| !f.is_empty()));
    }

    #[test]
    fn limits_travel_as_arguments() {
        let args = Limits {
            cpu_seconds: 3,
            address_space: 1 << 30,
            open_files: 64,
        }
        .args();
        assert_eq!(
            args,
            [
                "--cpu-seconds=3",
                "--address-space=1073741824",
                "--open-files=64"
            ]
            .map(OsString::from)
        );
    }
}
