//! The model served over FUSE.  Nothing is cached by the kernel (zero TTLs,
//! direct I/O), so what a process reads after a cut is what survived.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::model::{Kind, Model, Node, Res};

const TTL: Duration = Duration::ZERO;

pub struct Fs(pub Arc<Mutex<Model>>);

impl Fs {
    fn m(&self) -> MutexGuard<'_, Model> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn attr(ino: u64, n: &Node) -> FileAttr {
    let (kind, size) = match n.kind {
        Kind::File => (FileType::RegularFile, n.data.len() as u64),
        Kind::Dir => (FileType::Directory, 4096),
        Kind::Symlink => (FileType::Symlink, n.target.as_os_str().len() as u64),
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: n.mtime,
        mtime: n.mtime,
        ctime: n.mtime,
        crtime: n.mtime,
        kind,
        perm: n.mode as u16,
        nlink: n.nlink,
        uid: n.uid,
        gid: n.gid,
        rdev: 0,
        flags: 0,
        blksize: 4096,
    }
}

fn entry(m: &Model, ino: Res<u64>, reply: ReplyEntry) {
    match ino.and_then(|i| m.node(i).map(|n| attr(i, n))) {
        Ok(a) => reply.entry(&TTL, &a, Generation(0)),
        Err(e) => reply.error(Errno::from_i32(e)),
    }
}

fn empty(r: Res<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(Errno::from_i32(e)),
    }
}

fn node(req: &Request, kind: Kind, mode: u32, umask: u32) -> Node {
    Node::new(kind, mode & !umask, req.uid(), req.gid())
}

impl Filesystem for Fs {
    fn lookup(&self, _: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let m = self.m();
        entry(&m, m.lookup(parent.0, name), reply);
    }

    fn getattr(&self, _: &Request, ino: INodeNo, _: Option<FileHandle>, reply: ReplyAttr) {
        match self.m().node(ino.0) {
            Ok(n) => reply.attr(&TTL, &attr(ino.0, n)),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn setattr(
        &self,
        _: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _: Option<SystemTime>,
        _: Option<FileHandle>,
        _: Option<SystemTime>,
        _: Option<SystemTime>,
        _: Option<SystemTime>,
        _: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut m = self.m();
        let r = m.node_mut(ino.0).map(|n| {
            if let Some(v) = mode {
                n.mode = v & 0o7777;
            }
            n.uid = uid.unwrap_or(n.uid);
            n.gid = gid.unwrap_or(n.gid);
            if let Some(s) = size {
                n.data.resize(s as usize, 0);
            }
            n.mtime = match mtime {
                Some(TimeOrNow::SpecificTime(t)) => t,
                _ => SystemTime::now(),
            };
            attr(ino.0, n)
        });
        match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn readlink(&self, _: &Request, ino: INodeNo, reply: ReplyData) {
        match self.m().node(ino.0) {
            Ok(n) if n.kind == Kind::Symlink => reply.data(n.target.as_os_str().as_encoded_bytes()),
            Ok(_) => reply.error(Errno::EINVAL),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let mut m = self.m();
        let ino = m.create(parent.0, name, node(req, Kind::File, mode, umask));
        entry(&m, ino, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut m = self.m();
        let ino = m.create(parent.0, name, node(req, Kind::Dir, mode, umask));
        if let Ok(i) = ino {
            m.live.get_mut(&i).expect("just made").nlink = 2;
        }
        entry(&m, ino, reply);
    }

    fn unlink(&self, _: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.m().remove(parent.0, name, false), reply);
    }

    fn rmdir(&self, _: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.m().remove(parent.0, name, true), reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let mut n = node(req, Kind::Symlink, 0o777, 0);
        n.target = target.to_path_buf();
        let mut m = self.m();
        let ino = m.create(parent.0, name, n);
        entry(&m, ino, reply);
    }

    fn rename(
        &self,
        _: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            return reply.error(Errno::EINVAL);
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        empty(
            self.m()
                .rename(parent.0, name, newparent.0, newname, noreplace),
            reply,
        );
    }

    fn link(
        &self,
        _: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut m = self.m();
        let r = m.link(ino.0, newparent.0, newname).map(|()| ino.0);
        entry(&m, r, reply);
    }

    fn open(&self, _: &Request, ino: INodeNo, _: OpenFlags, reply: ReplyOpen) {
        match self.m().node(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _: i32,
        reply: ReplyCreate,
    ) {
        let mut m = self.m();
        let r = m
            .create(parent.0, name, node(req, Kind::File, mode, umask))
            .and_then(|i| m.node(i).map(|n| attr(i, n)));
        match r {
            Ok(a) => reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn read(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        offset: u64,
        size: u32,
        _: OpenFlags,
        _: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.m().node(ino.0) {
            Ok(n) => {
                let from = (offset as usize).min(n.data.len());
                let to = (from + size as usize).min(n.data.len());
                reply.data(&n.data[from..to]);
            }
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn write(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        offset: u64,
        data: &[u8],
        _: WriteFlags,
        _: OpenFlags,
        _: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut m = self.m();
        match m.node_mut(ino.0) {
            Ok(n) => {
                let end = offset as usize + data.len();
                if n.data.len() < end {
                    n.data.resize(end, 0);
                }
                n.data[offset as usize..end].copy_from_slice(data);
                n.mtime = SystemTime::now();
                reply.written(data.len() as u32);
            }
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn flush(&self, _: &Request, ino: INodeNo, _: FileHandle, _: LockOwner, reply: ReplyEmpty) {
        empty(self.m().node(ino.0).map(|_| ()), reply);
    }

    fn fsync(&self, _: &Request, ino: INodeNo, _: FileHandle, _: bool, reply: ReplyEmpty) {
        empty(self.m().fsync(ino.0), reply);
    }

    fn fsyncdir(&self, _: &Request, ino: INodeNo, _: FileHandle, _: bool, reply: ReplyEmpty) {
        empty(self.m().fsync(ino.0), reply);
    }

    fn readdir(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let m = self.m();
        let d = match m.node(ino.0) {
            Ok(d) if d.kind == Kind::Dir => d,
            Ok(_) => return reply.error(Errno::ENOTDIR),
            Err(e) => return reply.error(Errno::from_i32(e)),
        };
        let dots = [(OsStr::new("."), ino.0), (OsStr::new(".."), ino.0)];
        let all = dots
            .into_iter()
            .chain(d.entries.iter().map(|(k, v)| (k.as_os_str(), *v)));
        for (i, (name, child)) in all.enumerate().skip(offset as usize) {
            let kind = match m.live.get(&child).map(|n| n.kind) {
                Some(Kind::Dir) => FileType::Directory,
                Some(Kind::Symlink) => FileType::Symlink,
                _ => FileType::RegularFile,
            };
            if reply.add(INodeNo(child), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _: &Request, _: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 4096, 255, 4096);
    }
}
