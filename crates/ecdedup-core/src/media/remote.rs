//! A device across the network: one chunk on a chunk server
//! (docs/cluster.md, "The data path").
//!
//! The engine does not know sockets. A [`ChunkLink`] (the volume client's
//! connection to one chunk, in `ecdedup-client`; a simulated network in
//! the cluster simulator) sends one operation and hands back a
//! [`PendingReply`] at once; [`RemoteDevice`] is the [`Device`] over a
//! link, so the whole array (stripes, write policies, journals, intents,
//! checksums, decode) runs unchanged over chunks on other machines.
//!
//! A batch ([`super::batch::submit`]) sends every remote operation of the
//! batch before it waits for any reply: the units of one stripe write
//! travel to their servers in parallel, one round trip for the batch, as
//! the io_uring path submits every local unit in one system call.
//!
//! Invariants: a reply is waited for once; an operation whose reply does
//! not come (a timeout, a closed connection, a refusal) is an error of
//! that device only, which the array latches like a medium error.

use super::Device;
use std::io;
use std::sync::Arc;

/// One operation on a chunk.
#[derive(Clone, Copy, Debug)]
pub enum LinkOp<'a> {
    /// Reads `len` bytes at `offset`.
    Read { offset: u64, len: usize },
    /// Writes `buf` at `offset`; `fua`: durable before the reply.
    Write {
        offset: u64,
        buf: &'a [u8],
        fua: bool,
    },
    /// Makes the chunk's completed writes durable.
    Sync,
    /// `[offset, offset+len)` reads as zeroes from now on.
    Discard { offset: u64, len: u64 },
}

/// The reply to one operation, waited for once.
pub trait PendingReply: Send {
    /// Blocks until the reply: a read's bytes, empty for the other ops.
    fn wait(self: Box<Self>) -> io::Result<Vec<u8>>;
}

/// A reply known at once (a refusal before anything was sent).
pub struct Ready(pub io::Result<Vec<u8>>);

impl PendingReply for Ready {
    fn wait(self: Box<Self>) -> io::Result<Vec<u8>> {
        self.0
    }
}

/// A connection to one chunk.
pub trait ChunkLink: Send + Sync {
    /// Sends `op` and returns without waiting for its reply.
    fn send(&self, op: LinkOp<'_>) -> Box<dyn PendingReply>;
    /// The chunk's size in bytes.
    fn size(&self) -> u64;
    /// Where the chunk lives, for messages.
    fn describe(&self) -> String;
}

/// The [`Device`] over a [`ChunkLink`].
pub struct RemoteDevice {
    link: Arc<dyn ChunkLink>,
}

impl RemoteDevice {
    pub fn new(link: Arc<dyn ChunkLink>) -> RemoteDevice {
        RemoteDevice { link }
    }
}

/// Copies a read's reply into `buf`; a reply of another length is an
/// error (never a short read passed on as data).
pub fn fill_read(
    buf: &mut [u8],
    reply: io::Result<Vec<u8>>,
    what: &dyn Fn() -> String,
) -> io::Result<()> {
    let bytes = reply?;
    if bytes.len() != buf.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: a read of {} bytes answered with {}",
                what(),
                buf.len(),
                bytes.len()
            ),
        ));
    }
    buf.copy_from_slice(&bytes);
    Ok(())
}

impl Device for RemoteDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let reply = self
            .link
            .send(LinkOp::Read {
                offset,
                len: buf.len(),
            })
            .wait();
        fill_read(buf, reply, &|| self.link.describe())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.link
            .send(LinkOp::Write {
                offset,
                buf,
                fua: false,
            })
            .wait()
            .map(drop)
    }

    fn sync(&self) -> io::Result<()> {
        self.link.send(LinkOp::Sync).wait().map(drop)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.link
            .send(LinkOp::Discard { offset, len })
            .wait()
            .map(drop)
    }

    fn size(&self) -> u64 {
        self.link.size()
    }

    fn describe(&self) -> String {
        self.link.describe()
    }

    fn link(&self) -> Option<&dyn ChunkLink> {
        Some(self.link.as_ref())
    }
}
