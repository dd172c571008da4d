//! The seccomp filter itself, Linux's own: one BPF program made of three compiled with
//! seccompiler (rust-vmm) and the guard in front of them ([`program`]), and loading it
//! ([`load`]).
//! What the filter denies and why is [`super`]'s module documentation.
//!
//! Two kernel details shape the BPF beyond what seccompiler emits:
//! - seccompiler checks the architecture word and kills the process on any other
//!   (`SECCOMP_RET_KILL_PROCESS`), so 32-bit (i386) system calls of a 64-bit process never
//!   run; but the x32 ABI reports `AUDIT_ARCH_X86_64` with bit 30 set in the system call
//!   number, which seccompiler does not handle (rust-vmm/seccompiler issue 74). A guard of our
//!   own in front of the program denies every such number.
//! - `ioctl` requests and socket arguments are compared on their low 32 bits
//!   ([`SeccompCmpArgLen::Dword`]): the kernel truncates them to `unsigned int`, so a 64-bit
//!   comparison could be dodged by setting high bits (Flatpak's CVE-2019-10063).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch, sock_filter,
};

use super::FilterOptions;

/// Why the filter could not be built (the command then does not run).
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp: this architecture ({0}) is not supported")]
    Architecture(&'static str),
    #[error("seccomp: {0}")]
    Compile(#[from] seccompiler::BackendError),
}

/// `personality(2)` values the command may set: the query `0xffffffff`, `PER_LINUX` (0) and
/// `PER_LINUX32` (8). Anything else (notably `ADDR_NO_RANDOMIZE`, `READ_IMPLIES_EXEC`)
/// weakens the process's own defences.
const PERSONALITY_ALLOWED: [u64; 3] = [0xffff_ffff, 0, 8];

/// The socket type without its flags (`SOCK_NONBLOCK`, `SOCK_CLOEXEC`): linux/net.h's
/// `SOCK_TYPE_MASK`.
const SOCK_TYPE_MASK: u64 = 0xf;

/// `NETLINK_ROUTE`: interface and address queries (what `getifaddrs(3)` and glibc's
/// resolver use), the only netlink protocol left open.
const NETLINK_ROUTE: u64 = 0;

/// The filter as one program. Three parts because seccompiler gives one action per filter:
/// `clone3`, which fails with `ENOSYS` (its flags sit in memory a filter cannot read, so it
/// cannot be checked for `CLONE_NEWUSER`; glibc and language runtimes then fall back to
/// `clone`, which can); socket families that fail with `EAFNOSUPPORT` (glibc and language
/// runtimes treat that as "family not available" and fall back, as they would on a kernel
/// without it); and system calls that fail with `EPERM`. They are chained ([`chain`]) into
/// one program behind the x32 guard, so the kernel compiles and runs one filter, not three
/// (each filter loaded is a JIT compile at start-up and a program run on every system call).
pub fn program(options: FilterOptions) -> Result<BpfProgram, SeccompError> {
    Ok(with_x32_guard(chain(parts(options)?)))
}

/// The three parts, each a whole seccompiler program, in the order [`chain`] runs them.
/// Where a call matches in two, the first decides, as the last loaded of three separate
/// filters would (the kernel keeps the most recent filter's answer among equal actions).
fn parts(options: FilterOptions) -> Result<Vec<BpfProgram>, SeccompError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| SeccompError::Architecture(std::env::consts::ARCH))?;
    let filter =
        |rules, e| SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(errno(e)), arch);
    let enosys = filter(BTreeMap::from([(libc::SYS_clone3, Vec::new())]), libc::ENOSYS)?;
    let families = filter(socket_rules(options)?, libc::EAFNOSUPPORT)?;
    let eperm = filter(eperm_rules()?, libc::EPERM)?;
    Ok(vec![
        BpfProgram::try_from(enosys)?,
        BpfProgram::try_from(families)?,
        BpfProgram::try_from(eperm)?,
    ])
}

/// Joins whole programs into one: in every part but the last, each "allow" return becomes
/// a jump to the next part's first instruction (one instruction for one, so no other jump
/// moves). A part that denies, or kills on another architecture, ends the program there.
fn chain(parts: Vec<BpfProgram>) -> BpfProgram {
    let last = parts.len().saturating_sub(1);
    let mut joined = Vec::with_capacity(parts.iter().map(Vec::len).sum());
    for (n, part) in parts.into_iter().enumerate() {
        let len = part.len();
        joined.extend(part.into_iter().enumerate().map(|(i, insn)| {
            if n < last && insn.code == RET_K && insn.k == libc::SECCOMP_RET_ALLOW {
                // To the first instruction past this part: `len - i - 1` ahead.
                sock_filter {
                    code: JMP_JA,
                    jt: 0,
                    jf: 0,
                    k: u32::try_from(len - i - 1).unwrap_or(u32::MAX),
                }
            } else {
                insn
            }
        }));
    }
    joined
}

/// [`super::Filter::load`] on Linux, allocating nothing (it may run in the child of a fork).
pub(super) fn load(program: &[sock_filter]) -> Result<(), nix::errno::Errno> {
    seccompiler::apply_filter(program).map_err(|e| match e {
        seccompiler::Error::Prctl(e) | seccompiler::Error::Seccomp(e) => {
            nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EINVAL))
        }
        _ => nix::errno::Errno::EINVAL,
    })
}

fn errno(e: i32) -> u32 {
    u32::try_from(e).unwrap_or(1)
}

fn dword(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SeccompError> {
    Ok(SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)?)
}

/// System calls denied with `EPERM`; an empty rule list denies every use of the call.
fn eperm_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    // TIOCSTI pushes bytes into a terminal's input queue: the shell that started
    // `sandgate run` would read them as typed commands once the run ends (CVE-2017-5226).
    // TIOCLINUX can do the same on a virtual console (paste selection). Denying these two
    // requests keeps the terminal itself usable (job control, Ctrl-C, window size), which
    // `bwrap --new-session` would break.
    let ioctl_requests = [u64::from(libc::TIOCSTI as u32), u64::from(libc::TIOCLINUX as u32)];
    rules.insert(
        libc::SYS_ioctl,
        ioctl_requests
            .iter()
            .map(|&request| Ok(SeccompRule::new(vec![dword(1, SeccompCmpOp::Eq, request)?])?))
            .collect::<Result<_, SeccompError>>()?,
    );
    // The kernel keyring is not namespaced by bubblewrap: the command could read, replace or
    // add keys in the caller's session keyring (Flatpak denies these three too).
    for call in [libc::SYS_keyctl, libc::SYS_add_key, libc::SYS_request_key] {
        rules.insert(call, Vec::new());
    }
    // New user namespaces: inside one, the command would be "root" again and reach kernel
    // code that is otherwise out of its reach (mounts, packet and raw sockets, netfilter),
    // a recurring source of privilege escalations. bwrap's --disable-userns says the same
    // where it has it; this holds on every bwrap. clone3 is refused in its own program.
    let new_user = u64::from(libc::CLONE_NEWUSER as u32);
    for call in [libc::SYS_clone, libc::SYS_unshare] {
        rules.insert(
            call,
            vec![SeccompRule::new(vec![dword(
                0,
                SeccompCmpOp::MaskedEq(new_user),
                new_user,
            )?])?],
        );
    }
    // ptrace: no debugging or memory access of other processes (the init included).
    // userfaultfd, perf_event_open, bpf: kernel attack surface and side channels a command
    // does not need (bpf(2) is open to ordinary users where the kernel's
    // unprivileged_bpf_disabled is 0; classic socket filters do not use it). Modules and
    // kexec: changing the running kernel (already refused without host capabilities;
    // denied here so that no configuration can allow it).
    for call in [
        libc::SYS_ptrace,
        libc::SYS_userfaultfd,
        libc::SYS_perf_event_open,
        libc::SYS_bpf,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
    ] {
        rules.insert(call, Vec::new());
    }
    // io_uring: its operations run without passing through their system calls, so the
    // filter never sees them. IORING_OP_SOCKET (Linux 5.19) makes a socket of any family
    // without socket(2), which would undo the family rules below (a host Unix socket, audit
    // netlink); the other operations would escape any later rule the same way. Denied as
    // Docker's default profile does; runtimes that try it (libuv, Tokio's io-uring) fall
    // back to their ordinary paths on EPERM.
    for call in [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ] {
        rules.insert(call, Vec::new());
    }
    // personality: only the query and the two plain Linux personalities (see
    // PERSONALITY_ALLOWED); one rule whose conditions all hold for any other value.
    rules.insert(
        libc::SYS_personality,
        vec![SeccompRule::new(
            PERSONALITY_ALLOWED
                .iter()
                .map(|&v| dword(0, SeccompCmpOp::Ne, v))
                .collect::<Result<_, _>>()?,
        )?],
    );
    Ok(rules)
}

/// `socket(2)` families: an allow-list, written as one rule that holds (and so denies with
/// `EAFNOSUPPORT`) when the family is none of the allowed ones.
/// - `AF_INET`, `AF_INET6`: the network, which the namespace and the proxy govern.
/// - `AF_NETLINK` with `NETLINK_ROUTE` only: interface and address queries (what
///   `getifaddrs(3)` and glibc's resolver use); other netlink protocols reach kernel
///   subsystems (audit, uevents, netfilter, crypto) a command has no business with.
/// - `AF_UNIX` only where the policy opts in: a host Unix socket (docker.sock, an SSH agent,
///   D-Bus, X11's abstract socket in `net.mode: all`) is a way around any network policy;
///   the path refusals in the policy are the first layer, this is the second.
///
/// Everything else is refused: above all `AF_VSOCK`, which no network namespace isolates
/// (on a virtual machine it reaches the hypervisor's side, outside the policy and the
/// audit), and packet, Bluetooth, CAN, TIPC, RDS, XDP and the rest of the kernel's families.
/// `socketpair(2)` is allowed for `AF_UNIX` only, and (unless Unix sockets are allowed)
/// for stream and seqpacket pairs only: such a pair reaches nothing outside the process
/// tree (Python's asyncio and multiprocessing use it), where a datagram pair could still
/// `sendto` any Unix address, or be connected again to one (a host's /dev/log, an abstract
/// name).
fn socket_rules(options: FilterOptions) -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let family = |f: i32| u64::try_from(f).unwrap_or(u64::MAX);
    let mut allowed = vec![libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK];
    if options.allow_unix_sockets {
        allowed.push(libc::AF_UNIX);
    }
    let none_of = allowed
        .iter()
        .map(|&f| dword(0, SeccompCmpOp::Ne, family(f)))
        .collect::<Result<Vec<_>, _>>()?;
    let socket = vec![
        SeccompRule::new(none_of)?,
        SeccompRule::new(vec![
            dword(0, SeccompCmpOp::Eq, family(libc::AF_NETLINK))?,
            dword(2, SeccompCmpOp::Ne, NETLINK_ROUTE)?,
        ])?,
    ];
    let dgram = u64::try_from(libc::SOCK_DGRAM).unwrap_or(u64::MAX);
    let mut pair = vec![SeccompRule::new(vec![dword(
        0,
        SeccompCmpOp::Ne,
        family(libc::AF_UNIX),
    )?])?];
    if !options.allow_unix_sockets {
        pair.push(SeccompRule::new(vec![dword(
            1,
            SeccompCmpOp::MaskedEq(SOCK_TYPE_MASK),
            dgram,
        )?])?);
    }
    Ok(BTreeMap::from([
        (libc::SYS_socket, socket),
        (libc::SYS_socketpair, pair),
    ]))
}

/// `struct seccomp_data` offsets (linux/seccomp.h): `nr` at 0, `arch` at 4.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
/// linux/audit.h: `EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE`.
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// arch/x86/include/uapi/asm/unistd.h: `__X32_SYSCALL_BIT`.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
// linux/bpf_common.h opcodes: BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K,
// BPF_JMP|BPF_JSET|BPF_K, BPF_RET|BPF_K, BPF_JMP|BPF_JA.
const LD_W_ABS: u16 = 0x20;
const JMP_JEQ_K: u16 = 0x15;
const JMP_JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
const JMP_JA: u16 = 0x05;

fn insn(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Prepends the x32 guard on x86_64: an x86_64 system call whose number has bit 30 set is
/// denied with `EPERM`; any other architecture falls through to seccompiler's own check
/// (which kills). BPF jumps are relative, so seccompiler's program is unchanged behind it.
fn with_x32_guard(program: BpfProgram) -> BpfProgram {
    if std::env::consts::ARCH != "x86_64" {
        return program;
    }
    let mut guarded = vec![
        insn(LD_W_ABS, DATA_ARCH, 0, 0),
        // Not x86_64: skip the next three, into seccompiler's architecture check.
        insn(JMP_JEQ_K, AUDIT_ARCH_X86_64, 0, 3),
        insn(LD_W_ABS, DATA_NR, 0, 0),
        // The x32 bit: fall into the deny; otherwise skip it.
        insn(JMP_JSET_K, X32_SYSCALL_BIT, 0, 1),
        insn(
            RET_K,
            libc::SECCOMP_RET_ERRNO | (errno(libc::EPERM) & libc::SECCOMP_RET_DATA),
            0,
            0,
        ),
    ];
    guarded.extend(program);
    guarded
}

#[cfg(test)]
#[path = "filter_tests.rs"]
mod tests;
