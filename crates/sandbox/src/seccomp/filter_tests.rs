//! The filter run on sample system calls by a small classic-BPF interpreter (the subset
//! seccompiler and the x32 guard emit), so every rule and both ABI corner cases are checked
//! without loading anything into the kernel.

use super::*;

/// One system call as the kernel presents it to the filter.
struct Call {
    nr: i64,
    arch: u32,
    args: [u64; 6],
}

fn call(nr: i64, args: &[u64]) -> Call {
    let mut all = [0u64; 6];
    for (slot, value) in all.iter_mut().zip(args) {
        *slot = *value;
    }
    Call {
        nr,
        arch: AUDIT_ARCH_X86_64,
        args: all,
    }
}

fn word(c: &Call, offset: u32) -> u32 {
    match offset {
        0 => c.nr as u32,
        4 => c.arch,
        o if (16..64).contains(&o) => {
            let arg = c.args[((o - 16) / 8) as usize];
            if (o - 16) % 8 == 0 {
                arg as u32
            } else {
                (arg >> 32) as u32
            }
        }
        other => panic!("load of offset {other}"),
    }
}

fn run_one(program: &[sock_filter], c: &Call) -> u32 {
    let (mut pc, mut acc) = (0usize, 0u32);
    loop {
        let i = &program[pc];
        pc += 1;
        let jump = |cond: bool| if cond { i.jt as usize } else { i.jf as usize };
        match i.code {
            0x20 => acc = word(c, i.k),
            0x54 => acc &= i.k,
            0x05 => pc += i.k as usize,
            0x15 => pc += jump(acc == i.k),
            0x25 => pc += jump(acc > i.k),
            0x35 => pc += jump(acc >= i.k),
            0x45 => pc += jump(acc & i.k != 0),
            0x06 => return i.k,
            other => panic!("opcode {other:#x} at {}", pc - 1),
        }
    }
}

/// The verdict of the one program the sandbox loads.
fn verdict(options: FilterOptions, c: &Call) -> u32 {
    run_one(&program(options).unwrap(), c)
}

/// The kernel's verdict had the parts been loaded as separate filters, each behind the
/// guard, in the order they used to be (the EPERM part first, the clone3 part last): the
/// most restrictive action wins (SECCOMP_RET_ACTION_FULL compared as signed) and, among
/// equal actions, the most recently loaded filter's (the kernel walks from the newest and
/// replaces only on a strictly more restrictive one). `guarded` is in [`parts`]' order,
/// which is newest first.
fn separate_verdict(guarded: &[BpfProgram], c: &Call) -> u32 {
    guarded
        .iter()
        .map(|p| run_one(p, c))
        .fold(None, |best: Option<u32>, r| match best {
            Some(b) if (r & 0xffff_0000) as i32 >= (b & 0xffff_0000) as i32 => Some(b),
            _ => Some(r),
        })
        .unwrap()
}

const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
const EAFNOSUPPORT: u32 = libc::SECCOMP_RET_ERRNO | libc::EAFNOSUPPORT as u32;

fn default() -> FilterOptions {
    FilterOptions::default()
}

#[test]
fn terminal_injection_is_denied_on_the_low_32_bits_and_other_ioctls_pass() {
    let tiocsti = libc::TIOCSTI;
    assert_eq!(verdict(default(), &call(libc::SYS_ioctl, &[0, tiocsti])), EPERM);
    assert_eq!(
        verdict(default(), &call(libc::SYS_ioctl, &[0, (1 << 32) | tiocsti])),
        EPERM,
        "high bits must not dodge the rule (CVE-2019-10063)"
    );
    assert_eq!(
        verdict(default(), &call(libc::SYS_ioctl, &[0, libc::TIOCLINUX])),
        EPERM
    );
    for ok in [libc::TCGETS, libc::TIOCGWINSZ, libc::TIOCSPGRP, libc::FIONREAD] {
        assert_eq!(verdict(default(), &call(libc::SYS_ioctl, &[0, ok])), ALLOW);
    }
}

#[test]
fn every_listed_call_is_denied_and_ordinary_ones_pass() {
    for nr in [
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_ptrace,
        libc::SYS_userfaultfd,
        libc::SYS_perf_event_open,
        libc::SYS_bpf,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ] {
        assert_eq!(verdict(default(), &call(nr, &[])), EPERM, "syscall {nr}");
    }
    for nr in [libc::SYS_read, libc::SYS_openat, libc::SYS_execve] {
        assert_eq!(verdict(default(), &call(nr, &[])), ALLOW, "syscall {nr}");
    }
}

#[test]
fn no_new_user_namespace_by_clone_unshare_or_clone3() {
    let new_user = libc::CLONE_NEWUSER as u64;
    let thread = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
    for nr in [libc::SYS_clone, libc::SYS_unshare] {
        assert_eq!(verdict(default(), &call(nr, &[new_user])), EPERM, "syscall {nr}");
        assert_eq!(
            verdict(default(), &call(nr, &[new_user | libc::CLONE_NEWNET as u64])),
            EPERM
        );
        assert_eq!(
            verdict(default(), &call(nr, &[(1 << 32) | new_user])),
            EPERM,
            "high bits must not dodge the rule"
        );
    }
    // Ordinary forks and threads, and other namespaces (refused by the kernel without
    // capabilities), pass the filter.
    assert_eq!(verdict(default(), &call(libc::SYS_clone, &[thread])), ALLOW);
    assert_eq!(
        verdict(default(), &call(libc::SYS_clone, &[libc::SIGCHLD as u64])),
        ALLOW
    );
    assert_eq!(
        verdict(default(), &call(libc::SYS_unshare, &[libc::CLONE_NEWNS as u64])),
        ALLOW
    );
    // clone3 keeps its flags in memory: refused as "not implemented", so callers use clone.
    assert_eq!(
        verdict(default(), &call(libc::SYS_clone3, &[])),
        libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32
    );
}

#[test]
fn personality_allows_only_the_query_and_plain_linux() {
    for ok in [0xffff_ffff, 0, 8, 0xffff_ffff_ffff_ffff] {
        assert_eq!(
            verdict(default(), &call(libc::SYS_personality, &[ok])),
            ALLOW,
            "{ok:#x}"
        );
    }
    for bad in [0x0040000, 0x0400000, 0x0008] {
        let want = if bad == 8 { ALLOW } else { EPERM };
        assert_eq!(
            verdict(default(), &call(libc::SYS_personality, &[bad])),
            want,
            "{bad:#x}"
        );
    }
}

#[test]
fn unix_sockets_unless_opted_in_and_netlink_beyond_routing_are_refused() {
    let socket = |family: i32, protocol: u64| call(libc::SYS_socket, &[family as u64, 1, protocol]);
    assert_eq!(verdict(default(), &socket(libc::AF_UNIX, 0)), EAFNOSUPPORT);
    assert_eq!(verdict(default(), &socket(libc::AF_INET, 0)), ALLOW);
    assert_eq!(verdict(default(), &socket(libc::AF_INET6, 0)), ALLOW);
    assert_eq!(verdict(default(), &socket(libc::AF_NETLINK, 0)), ALLOW);
    assert_eq!(verdict(default(), &socket(libc::AF_NETLINK, 9)), EAFNOSUPPORT);
    assert_eq!(
        verdict(
            default(),
            &call(libc::SYS_socketpair, &[libc::AF_UNIX as u64, 1, 0])
        ),
        ALLOW
    );
    let opted_in = FilterOptions {
        allow_unix_sockets: true,
    };
    assert_eq!(verdict(opted_in, &socket(libc::AF_UNIX, 0)), ALLOW);
    assert_eq!(verdict(opted_in, &socket(libc::AF_NETLINK, 9)), EAFNOSUPPORT);
}

#[test]
fn socket_families_are_an_allow_list_vsock_above_all_refused() {
    let socket = |family: i32| call(libc::SYS_socket, &[family as u64, 1, 0]);
    for options in [
        default(),
        FilterOptions {
            allow_unix_sockets: true,
        },
    ] {
        for refused in [
            libc::AF_VSOCK,
            libc::AF_PACKET,
            libc::AF_BLUETOOTH,
            libc::AF_CAN,
            libc::AF_TIPC,
            libc::AF_RDS,
            libc::AF_XDP,
            libc::AF_ALG,
            libc::AF_KEY,
            libc::AF_APPLETALK,
            libc::AF_X25,
            46,
            255,
        ] {
            assert_eq!(
                verdict(options, &socket(refused)),
                EAFNOSUPPORT,
                "family {refused}"
            );
        }
        // The kernel reads the family as an int: high bits neither dodge nor trip the rule.
        let high = |family: i32| call(libc::SYS_socket, &[(1 << 32) | family as u64, 1, 0]);
        assert_eq!(verdict(options, &high(libc::AF_VSOCK)), EAFNOSUPPORT);
        assert_eq!(verdict(options, &high(libc::AF_INET)), ALLOW);
    }
    assert_eq!(
        verdict(
            default(),
            &call(libc::SYS_socketpair, &[libc::AF_VSOCK as u64, 1, 0])
        ),
        EAFNOSUPPORT
    );
    // Datagram pairs can sendto (or reconnect to) any Unix address: refused, whatever the
    // flags; stream and seqpacket pairs stay.
    let pair = |kind: i32| call(libc::SYS_socketpair, &[libc::AF_UNIX as u64, kind as u64, 0]);
    assert_eq!(verdict(default(), &pair(libc::SOCK_DGRAM)), EAFNOSUPPORT);
    assert_eq!(
        verdict(
            default(),
            &pair(libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK)
        ),
        EAFNOSUPPORT
    );
    assert_eq!(
        verdict(default(), &pair(libc::SOCK_STREAM | libc::SOCK_CLOEXEC)),
        ALLOW
    );
    assert_eq!(verdict(default(), &pair(libc::SOCK_SEQPACKET)), ALLOW);
    // Where the policy allows Unix sockets, a datagram pair gives nothing socket() would not.
    let opted_in = FilterOptions {
        allow_unix_sockets: true,
    };
    assert_eq!(verdict(opted_in, &pair(libc::SOCK_DGRAM)), ALLOW);
}

#[test]
fn x32_numbers_are_denied_and_other_architectures_are_killed() {
    // x32's ioctl is 514 with bit 30 set; without the guard it would match no rule.
    let x32 = call(X32_SYSCALL_BIT as i64 | 514, &[0, libc::TIOCSTI]);
    assert_eq!(verdict(default(), &x32), EPERM);
    assert_eq!(verdict(default(), &call(X32_SYSCALL_BIT as i64 | 39, &[])), EPERM);
    let mut i386 = call(libc::SYS_getpid, &[]);
    i386.arch = 3 | 0x4000_0000; // AUDIT_ARCH_I386
    assert_eq!(verdict(default(), &i386), libc::SECCOMP_RET_KILL_PROCESS);
}

#[test]
fn the_chained_program_answers_as_its_parts_loaded_one_by_one_would() {
    // Every system call number the kernel has (and a few past it), with arguments that
    // reach every rule: socket families and types, ioctl requests, clone and unshare flags,
    // personality values; under both options and three architecture words.
    let words: [u64; 12] = [
        0,
        1,
        2,
        8,
        10,
        16,
        40,
        libc::TIOCSTI,
        libc::CLONE_NEWUSER as u64,
        0xffff_ffff,
        0x1_0000_0000 | libc::TIOCSTI,
        u64::MAX,
    ];
    let mut compared = 0;
    for options in [
        default(),
        FilterOptions {
            allow_unix_sockets: true,
        },
    ] {
        let joined = program(options).unwrap();
        let guarded: Vec<BpfProgram> = parts(options).unwrap().into_iter().map(with_x32_guard).collect();
        for nr in 0..480i64 {
            for arch in [AUDIT_ARCH_X86_64, 3 | 0x4000_0000] {
                for nr in [nr, X32_SYSCALL_BIT as i64 | nr] {
                    for (a, b) in words.iter().zip(words.iter().rev()) {
                        let mut c = call(nr, &[*a, *b, *a, *b]);
                        c.arch = arch;
                        assert_eq!(
                            run_one(&joined, &c),
                            separate_verdict(&guarded, &c),
                            "nr {nr:#x}, arch {arch:#x}, args {a:#x} {b:#x}, {options:?}"
                        );
                        compared += 1;
                    }
                }
            }
        }
    }
    assert!(compared > 40_000);
    // Chaining equals separate filters only while every part answers allow, errno, or the
    // architecture check's kill: a later part's stronger action (a kill, a trap) would be
    // cut short by an earlier part's errno.
    let actions = [
        libc::SECCOMP_RET_ALLOW,
        libc::SECCOMP_RET_ERRNO,
        libc::SECCOMP_RET_KILL_PROCESS,
    ];
    for part in parts(default()).unwrap() {
        for insn in part.iter().filter(|i| i.code == RET_K) {
            assert!(
                actions.contains(&(insn.k & 0xffff_0000)),
                "a part returns {:#x}",
                insn.k
            );
        }
    }
    // And it is one program, its jumps all inside it (the kernel refuses any other).
    let joined = program(default()).unwrap();
    for (i, insn) in joined.iter().enumerate() {
        if insn.code == JMP_JA {
            assert!(
                i + 1 + (insn.k as usize) < joined.len(),
                "a jump past the end at {i}"
            );
        }
    }
}
