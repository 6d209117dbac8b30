//! A seccomp profile in Docker's JSON form, compiled to a classic BPF
//! program and installed on the calling process (lw-confine).
//!
//! Why loopwright compiles one itself: gVisor's runsc (Debian's, 2022-12)
//! applies the OCI seccomp profile to a container's first process only; a
//! process started by `docker exec` runs with none (`Seccomp: 0`), so
//! `unshare -Ur` works there.  Every exec loopwright makes into a gVisor
//! sandbox therefore starts `lw-confine`, which installs the same profile
//! the container was given (`runtime/seccomp.json`) and then execs the
//! command.  gVisor runs seccomp filters of its applications itself, so the
//! filter holds inside its kernel as the container's own does.
//!
//! The profile is read as dockerd reads it for a container with no
//! capabilities on x86_64: a rule that `includes` capabilities is left out,
//! one that `excludes` them is kept; `arches` is matched against `amd64`;
//! `minKernel` is taken as met (dockerd compares it with the host's kernel,
//! and gVisor reports 4.4.0 inside).  Differences from libseccomp's program,
//! all stricter: only x86_64 system calls are allowed (dockerd's profile
//! also admits the i386 and x32 entry points, which gVisor does not
//! implement); the comparisons are `EQ`, `NE` and `MASKED_EQ` (the only
//! ones the profile uses), any other is refused when compiling.
//!
//! The program: check the architecture, refuse x32 numbers, then the
//! allowed numbers in sorted chunks of 16 (a `jgt` skips a chunk), each an
//! `jeq` followed by its action or by its argument tests.  Chunks keep every
//! jump inside the 255 instructions a conditional jump can reach.

mod x86_64;

use serde::Deserialize;

use base::error::{Error, Exit, Result};

/// One BPF instruction (`struct sock_filter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

/// `AUDIT_ARCH_X86_64`.
pub const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
/// System call numbers at or above this are x32's.
const X32_BIT: u32 = 0x4000_0000;

pub const RET_ALLOW: u32 = 0x7fff_0000;
pub const RET_ERRNO: u32 = 0x0005_0000;
pub const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_KILL_THREAD: u32 = 0;
const RET_TRAP: u32 = 0x0003_0000;
const RET_LOG: u32 = 0x7ffc_0000;

const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const JGT_K: u16 = 0x25;
const JGE_K: u16 = 0x35;
const AND_K: u16 = 0x54;
const RET_K: u16 = 0x06;

/// Offsets in `struct seccomp_data`.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const OFF_ARGS: u32 = 16;

const EPERM: u32 = 1;
const CHUNK: usize = 16;

#[derive(Deserialize)]
struct Profile {
    #[serde(rename = "defaultAction")]
    default_action: String,
    #[serde(rename = "defaultErrnoRet")]
    default_errno: Option<u32>,
    #[serde(default)]
    syscalls: Vec<Rule>,
}

#[derive(Deserialize)]
struct Rule {
    names: Vec<String>,
    action: String,
    #[serde(default)]
    args: Option<Vec<Arg>>,
    #[serde(default)]
    includes: Filter,
    #[serde(default)]
    excludes: Filter,
    #[serde(rename = "errnoRet")]
    errno: Option<u32>,
}

#[derive(Deserialize, Default)]
struct Filter {
    #[serde(default)]
    caps: Vec<String>,
    #[serde(default)]
    arches: Vec<String>,
}

#[derive(Deserialize, Clone)]
struct Arg {
    index: u32,
    value: u64,
    #[serde(rename = "valueTwo", default)]
    value_two: u64,
    op: String,
}

/// One argument test: `(arg[index] & mask) OP value`.
#[derive(Clone, Debug)]
struct Cond {
    index: u32,
    mask: u64,
    value: u64,
    equal: bool,
}

/// The conditions (all must hold) and the action of one rule.
type Case = (Vec<Cond>, u32);

/// Each system call's cases, by number, and the default action.
type Rules = (Vec<(u32, Vec<Case>)>, u32);

fn bad(msg: String) -> Error {
    Error::new(Exit::Config, format!("seccomp profile: {msg}"))
}

fn action(name: &str, errno: Option<u32>) -> Result<u32> {
    Ok(match name {
        "SCMP_ACT_ALLOW" => RET_ALLOW,
        "SCMP_ACT_ERRNO" => RET_ERRNO | (errno.unwrap_or(EPERM) & 0xffff),
        "SCMP_ACT_KILL_PROCESS" => RET_KILL_PROCESS,
        "SCMP_ACT_KILL" | "SCMP_ACT_KILL_THREAD" => RET_KILL_THREAD,
        "SCMP_ACT_TRAP" => RET_TRAP,
        "SCMP_ACT_LOG" => RET_LOG,
        other => return Err(bad(format!("action '{other}' is not supported"))),
    })
}

fn cond(a: &Arg) -> Result<Cond> {
    if a.index > 5 {
        return Err(bad(format!("argument index {} is past the sixth", a.index)));
    }
    let (mask, value, equal) = match a.op.as_str() {
        "SCMP_CMP_EQ" => (u64::MAX, a.value, true),
        "SCMP_CMP_NE" => (u64::MAX, a.value, false),
        "SCMP_CMP_MASKED_EQ" => (a.value, a.value_two, true),
        other => return Err(bad(format!("comparison '{other}' is not supported"))),
    };
    Ok(Cond {
        index: a.index,
        mask,
        value: value & mask,
        equal,
    })
}

/// The number of the x86_64 system call `name`.
pub fn syscall_number(name: &str) -> Option<u32> {
    x86_64::SYSCALLS
        .binary_search_by(|(n, _)| n.cmp(&name))
        .ok()
        .map(|i| x86_64::SYSCALLS[i].1)
}

/// The profile's rules for a process without capabilities on x86_64:
/// each system call's cases in the profile's order, and the default action.
fn cases(json: &str) -> Result<Rules> {
    let p: Profile = serde_json::from_str(json).map_err(|e| bad(format!("not a profile: {e}")))?;
    let default = action(&p.default_action, p.default_errno)?;
    let mut by_nr: std::collections::BTreeMap<u32, Vec<Case>> = Default::default();
    for r in &p.syscalls {
        if !r.includes.caps.is_empty() {
            continue;
        }
        if !r.includes.arches.is_empty() && !r.includes.arches.iter().any(|a| a == "amd64") {
            continue;
        }
        if r.excludes.arches.iter().any(|a| a == "amd64") {
            continue;
        }
        let act = action(&r.action, r.errno)?;
        let conds = r
            .args
            .iter()
            .flatten()
            .map(cond)
            .collect::<Result<Vec<_>>>()?;
        for n in &r.names {
            if let Some(nr) = syscall_number(n) {
                by_nr.entry(nr).or_default().push((conds.clone(), act));
            }
        }
    }
    Ok((by_nr.into_iter().collect(), default))
}

/// A jump target, resolved when the program is laid out.
#[derive(Clone, Copy)]
enum To {
    Next,
    Label(usize),
}

enum Op {
    Plain(Insn),
    Jump(u16, u32, To, To),
    Label(usize),
}

struct Asm {
    ops: Vec<Op>,
    labels: usize,
}

impl Asm {
    fn label(&mut self) -> usize {
        self.labels += 1;
        self.labels - 1
    }
    fn at(&mut self, l: usize) {
        self.ops.push(Op::Label(l));
    }
    fn ld(&mut self, off: u32) {
        self.ops.push(Op::Plain(Insn {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: off,
        }));
    }
    fn and(&mut self, k: u32) {
        self.ops.push(Op::Plain(Insn {
            code: AND_K,
            jt: 0,
            jf: 0,
            k,
        }));
    }
    fn ret(&mut self, k: u32) {
        self.ops.push(Op::Plain(Insn {
            code: RET_K,
            jt: 0,
            jf: 0,
            k,
        }));
    }
    fn jump(&mut self, code: u16, k: u32, t: To, f: To) {
        self.ops.push(Op::Jump(code, k, t, f));
    }

    fn finish(self) -> Result<Vec<Insn>> {
        let mut at = vec![0usize; self.labels];
        let mut n = 0;
        for op in &self.ops {
            match op {
                Op::Label(l) => at[*l] = n,
                _ => n += 1,
            }
        }
        let mut out = Vec::with_capacity(n);
        for op in self.ops {
            match op {
                Op::Label(_) => {}
                Op::Plain(i) => out.push(i),
                Op::Jump(code, k, t, f) => {
                    let here = out.len() + 1;
                    let off = |to: To| -> Result<u8> {
                        let d = match to {
                            To::Next => 0,
                            To::Label(l) => at[l] - here,
                        };
                        u8::try_from(d).map_err(|_| {
                            Error::new(Exit::Software, format!("seccomp jump of {d} is too far"))
                        })
                    };
                    out.push(Insn {
                        code,
                        jt: off(t)?,
                        jf: off(f)?,
                        k,
                    });
                }
            }
        }
        if out.len() > 4096 {
            return Err(Error::new(
                Exit::Software,
                format!("seccomp program of {} instructions is too long", out.len()),
            ));
        }
        Ok(out)
    }
}

/// Tests of one system call's cases; falls through to `miss` when none holds.
fn emit_cases(a: &mut Asm, cases: &[Case], default: u32) {
    if let Some((_, act)) = cases.iter().find(|(c, _)| c.is_empty()) {
        a.ret(*act);
        return;
    }
    for (conds, act) in cases {
        let next = a.label();
        for c in conds {
            let off = OFF_ARGS + 8 * c.index;
            let halves: Vec<(u32, u32, u32)> = [(off, 0u32), (off + 4, 32)]
                .into_iter()
                .map(|(o, s)| (o, (c.mask >> s) as u32, (c.value >> s) as u32))
                .filter(|(_, m, _)| *m != 0)
                .collect();
            // EQ: every half equal, else the next case.  NE: a differing
            // half holds; both equal is the one miss.
            let take = a.label();
            if halves.is_empty() && !c.equal {
                a.jump(JEQ_K, 0, To::Label(next), To::Label(next));
            }
            for (i, (o, m, v)) in halves.iter().enumerate() {
                a.ld(*o);
                if *m != u32::MAX {
                    a.and(*m);
                }
                let last = i + 1 == halves.len();
                match (c.equal, last) {
                    (true, _) => a.jump(JEQ_K, *v, To::Next, To::Label(next)),
                    (false, false) => a.jump(JEQ_K, *v, To::Next, To::Label(take)),
                    (false, true) => a.jump(JEQ_K, *v, To::Label(next), To::Label(take)),
                }
            }
            a.at(take);
        }
        a.ret(*act);
        a.at(next);
    }
    a.ret(default);
}

/// The BPF program of the Docker-format profile `json`, for x86_64.
pub fn compile(json: &str) -> Result<Vec<Insn>> {
    let (rules, default) = cases(json)?;
    let mut a = Asm {
        ops: Vec::new(),
        labels: 0,
    };
    let native = a.label();
    a.ld(OFF_ARCH);
    a.jump(JEQ_K, AUDIT_ARCH_X86_64, To::Label(native), To::Next);
    a.ret(default);
    a.at(native);
    a.ld(OFF_NR);
    let not_x32 = a.label();
    a.jump(JGE_K, X32_BIT, To::Next, To::Label(not_x32));
    a.ret(default);
    a.at(not_x32);
    for chunk in rules.chunks(CHUNK) {
        let after = a.label();
        let max = chunk.last().map(|(nr, _)| *nr).unwrap_or(0);
        a.jump(JGT_K, max, To::Label(after), To::Next);
        for (nr, cases) in chunk {
            let skip = a.label();
            a.jump(JEQ_K, *nr, To::Next, To::Label(skip));
            emit_cases(&mut a, cases, default);
            a.at(skip);
            // The accumulator holds the number again for the next test.
            if cases.iter().all(|(c, _)| c.is_empty()) {
                continue;
            }
            a.ld(OFF_NR);
        }
        a.ret(default);
        a.at(after);
    }
    a.ret(default);
    a.finish()
}

/// Sets no-new-privileges and installs `prog` on the calling thread; every
/// process it then execs keeps the filter.
pub fn install(prog: &[Insn]) -> Result<()> {
    rustix::thread::set_no_new_privs(true)
        .map_err(|e| Error::new(Exit::NoPerm, format!("cannot set no-new-privileges: {e}")))?;
    #[repr(C)]
    struct Fprog {
        len: u16,
        filter: *const Insn,
    }
    let f = Fprog {
        len: u16::try_from(prog.len()).expect("compile keeps programs under 4096"),
        filter: prog.as_ptr(),
    };
    // SAFETY: `f` points at `prog.len()` instructions laid out as the
    // kernel's `struct sock_filter`, alive for the call; the kernel copies them.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0u32,
            &f as *const Fprog,
        )
    };
    if r != 0 {
        return Err(Error::new(
            Exit::NoPerm,
            format!(
                "cannot install the seccomp filter: {}",
                std::io::Error::last_os_error()
            ),
        ));
    }
    Ok(())
}

/// Runs `prog` on one system call as the kernel would: the action returned.
pub fn evaluate(prog: &[Insn], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
    let word = |off: u32| -> u32 {
        match off {
            OFF_NR => nr,
            OFF_ARCH => arch,
            o if o >= OFF_ARGS => {
                let i = ((o - OFF_ARGS) / 8) as usize;
                if (o - OFF_ARGS).is_multiple_of(8) {
                    args[i] as u32
                } else {
                    (args[i] >> 32) as u32
                }
            }
            _ => 0,
        }
    };
    let (mut acc, mut pc) = (0u32, 0usize);
    loop {
        let i = prog[pc];
        pc += 1;
        match i.code {
            LD_W_ABS => acc = word(i.k),
            AND_K => acc &= i.k,
            RET_K => return i.k,
            JEQ_K | JGT_K | JGE_K => {
                let hit = match i.code {
                    JEQ_K => acc == i.k,
                    JGT_K => acc > i.k,
                    _ => acc >= i.k,
                };
                pc += if hit { i.jt } else { i.jf } as usize;
            }
            c => panic!("instruction {c:#x} is not one compile emits"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROFILE: &str = crate::SECCOMP_PROFILE;

    fn run(prog: &[Insn], name: &str, args: [u64; 6]) -> u32 {
        let nr = syscall_number(name).expect(name);
        evaluate(prog, nr, AUDIT_ARCH_X86_64, args)
    }

    #[test]
    fn the_sandbox_profile_denies_namespaces_and_mounts_and_allows_the_rest() {
        let p = compile(PROFILE).expect("the sandbox profile compiles");
        let eperm = RET_ERRNO | EPERM;
        for name in [
            "read",
            "write",
            "openat",
            "execve",
            "mmap",
            "ptrace",
            "arch_prctl",
        ] {
            assert_eq!(run(&p, name, [0; 6]), RET_ALLOW, "{name}");
        }
        for name in [
            "unshare",
            "setns",
            "mount",
            "umount2",
            "pivot_root",
            "bpf",
            "io_uring_setup",
            "kexec_load",
            "open_by_handle_at",
            "chroot",
        ] {
            assert_eq!(run(&p, name, [0; 6]), eperm, "{name}");
        }
        // clone: a thread or a fork, not a namespace (CLONE_NEWUSER, NEWNS).
        assert_eq!(run(&p, "clone", [0x003d_0f00, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&p, "clone", [0x1000_0000 | 0x11, 0, 0, 0, 0, 0]), eperm);
        assert_eq!(run(&p, "clone", [0x0002_0000, 0, 0, 0, 0, 0]), eperm);
        // clone3 answers ENOSYS so that libc falls back to clone.
        assert_eq!(run(&p, "clone3", [0; 6]), RET_ERRNO | 38);
        // personality: only the listed values, all 64 bits compared.
        assert_eq!(run(&p, "personality", [8, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(
            run(&p, "personality", [0xffff_ffff, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(run(&p, "personality", [1, 0, 0, 0, 0, 0]), eperm);
        assert_eq!(
            run(&p, "personality", [8 | (1 << 32), 0, 0, 0, 0, 0]),
            eperm
        );
        // Another architecture's or x32's numbers: the default.
        let nr = syscall_number("read").expect("read");
        assert_eq!(evaluate(&p, nr, 0x4000_0003, [0; 6]), eperm);
        assert_eq!(evaluate(&p, nr | X32_BIT, AUDIT_ARCH_X86_64, [0; 6]), eperm);
        // A number past every rule.
        assert_eq!(evaluate(&p, 1000, AUDIT_ARCH_X86_64, [0; 6]), eperm);
        // Every x86_64 call the profile allows unconditionally is allowed.
        let (rules, _) = cases(PROFILE).expect("cases");
        for (nr, cs) in &rules {
            if let Some((_, act)) = cs.iter().find(|(c, _)| c.is_empty()) {
                assert_eq!(evaluate(&p, *nr, AUDIT_ARCH_X86_64, [0; 6]), *act, "{nr}");
            }
        }
        assert!(p.len() < 1200, "{} instructions", p.len());
    }

    #[test]
    fn ne_and_bad_profiles() {
        let p = compile(
            r#"{"defaultAction":"SCMP_ACT_ERRNO","defaultErrnoRet":13,"syscalls":[
            {"names":["read"],"action":"SCMP_ACT_ALLOW","args":[{"index":0,"value":3,"op":"SCMP_CMP_NE"}]},
            {"names":["write"],"action":"SCMP_ACT_ALLOW","includes":{"caps":["CAP_SYS_ADMIN"]}},
            {"names":["nosuch","getpid"],"action":"SCMP_ACT_ALLOW"}]}"#,
        )
        .expect("compiles");
        let deny = RET_ERRNO | 13;
        assert_eq!(run(&p, "read", [3, 0, 0, 0, 0, 0]), deny);
        assert_eq!(run(&p, "read", [4, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&p, "read", [3 | (1 << 32), 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&p, "write", [0; 6]), deny);
        assert_eq!(run(&p, "getpid", [0; 6]), RET_ALLOW);
        for bad in [
            "nope",
            r#"{"defaultAction":"SCMP_ACT_NOTIFY","syscalls":[]}"#,
            r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read"],"action":"SCMP_ACT_ALLOW","args":[{"index":0,"value":3,"op":"SCMP_CMP_GT"}]}]}"#,
        ] {
            assert_eq!(compile(bad).unwrap_err().exit, Exit::Config, "{bad}");
        }
    }
}
