//! A minimal NBD client over a Unix socket: fixed newstyle handshake,
//! NBD_OPT_GO on the default export, simple replies (no structured replies
//! are negotiated), one request in flight at a time. Enough to know exactly
//! which writes a server acknowledged, and to send requests that well-behaved
//! clients (nbdinfo, fio, qemu) never would, such as out-of-range ones.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const INFO_EXPORT: u16 = 0;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_FLAG_FUA: u16 = 1;

/// Transmission flags the server may advertise.
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

/// How long any single request may take before the client gives up.
const IO_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug)]
pub enum Error {
    /// The connection broke (the server died, or a timeout).
    Io(std::io::Error),
    /// The server answered with this NBD error (an errno value).
    Server(u32),
    /// The server said something that breaks the protocol.
    Protocol(String),
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

pub struct Client {
    sock: UnixStream,
    pub size: u64,
    pub flags: u16,
    next_handle: u64,
}

fn read_u16(s: &mut UnixStream) -> Result<u16> {
    let mut b = [0u8; 2];
    s.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

fn read_u32(s: &mut UnixStream) -> Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_u64(s: &mut UnixStream) -> Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

impl Client {
    pub fn connect(path: &Path) -> Result<Client> {
        let mut sock = UnixStream::connect(path)?;
        sock.set_read_timeout(Some(IO_TIMEOUT))?;
        sock.set_write_timeout(Some(IO_TIMEOUT))?;
        if read_u64(&mut sock)? != NBDMAGIC {
            return Err(Error::Protocol("no NBDMAGIC".into()));
        }
        if read_u64(&mut sock)? != IHAVEOPT {
            return Err(Error::Protocol("not a newstyle server".into()));
        }
        let hs = read_u16(&mut sock)?;
        if hs & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(Error::Protocol("server is not fixed newstyle".into()));
        }
        let client_flags = (hs & (FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES)) as u32;
        let mut msg = Vec::new();
        msg.extend_from_slice(&client_flags.to_be_bytes());
        // NBD_OPT_GO, default export "", no information requests.
        msg.extend_from_slice(&IHAVEOPT.to_be_bytes());
        msg.extend_from_slice(&OPT_GO.to_be_bytes());
        msg.extend_from_slice(&6u32.to_be_bytes());
        msg.extend_from_slice(&0u32.to_be_bytes());
        msg.extend_from_slice(&0u16.to_be_bytes());
        sock.write_all(&msg)?;
        let mut size = None;
        let mut flags = 0;
        loop {
            if read_u64(&mut sock)? != OPT_REPLY_MAGIC {
                return Err(Error::Protocol("bad option reply magic".into()));
            }
            let opt = read_u32(&mut sock)?;
            let typ = read_u32(&mut sock)?;
            let len = read_u32(&mut sock)? as usize;
            if len > 1 << 20 {
                return Err(Error::Protocol(format!("option reply of {len} bytes")));
            }
            let mut data = vec![0u8; len];
            sock.read_exact(&mut data)?;
            if opt != OPT_GO {
                return Err(Error::Protocol(format!(
                    "reply to option {opt}, sent {OPT_GO}"
                )));
            }
            match typ {
                REP_ACK => break,
                REP_INFO if len >= 2 => {
                    let info = u16::from_be_bytes([data[0], data[1]]);
                    if info == INFO_EXPORT && len >= 12 {
                        size = Some(u64::from_be_bytes(data[2..10].try_into().unwrap()));
                        flags = u16::from_be_bytes([data[10], data[11]]);
                    }
                }
                t if t & 0x8000_0000 != 0 => {
                    return Err(Error::Protocol(format!(
                        "NBD_OPT_GO refused: error {t:#x} {}",
                        String::from_utf8_lossy(&data)
                    )))
                }
                _ => {}
            }
        }
        let size = size.ok_or_else(|| Error::Protocol("no NBD_INFO_EXPORT before ACK".into()))?;
        Ok(Client {
            sock,
            size,
            flags,
            next_handle: 1,
        })
    }

    /// Sends one request and waits for its simple reply.
    pub fn request(
        &mut self,
        typ: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: Option<&[u8]>,
    ) -> Result<Vec<u8>> {
        let handle = self.next_handle;
        self.next_handle += 1;
        let mut hdr = Vec::with_capacity(28 + payload.map_or(0, |p| p.len()));
        hdr.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        hdr.extend_from_slice(&flags.to_be_bytes());
        hdr.extend_from_slice(&typ.to_be_bytes());
        hdr.extend_from_slice(&handle.to_be_bytes());
        hdr.extend_from_slice(&offset.to_be_bytes());
        hdr.extend_from_slice(&len.to_be_bytes());
        if let Some(p) = payload {
            hdr.extend_from_slice(p);
        }
        self.sock.write_all(&hdr)?;
        if typ == CMD_DISC {
            return Ok(Vec::new());
        }
        if read_u32(&mut self.sock)? != SIMPLE_REPLY_MAGIC {
            return Err(Error::Protocol(
                "bad reply magic (structured reply?)".into(),
            ));
        }
        let error = read_u32(&mut self.sock)?;
        let h = read_u64(&mut self.sock)?;
        if h != handle {
            return Err(Error::Protocol(format!(
                "reply for handle {h}, expected {handle}"
            )));
        }
        if error != 0 {
            return Err(Error::Server(error));
        }
        let mut data = Vec::new();
        if typ == CMD_READ {
            data.resize(len as usize, 0);
            self.sock.read_exact(&mut data)?;
        }
        Ok(data)
    }

    pub fn read(&mut self, offset: u64, len: usize) -> Result<Vec<u8>> {
        self.request(CMD_READ, 0, offset, len as u32, None)
    }

    /// Reads any length, in requests of at most 1 MiB.
    pub fn read_all(&mut self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let n = (len - out.len()).min(1 << 20);
            out.extend(self.read(offset + out.len() as u64, n)?);
        }
        Ok(out)
    }

    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.request(CMD_WRITE, flags, offset, data.len() as u32, Some(data))
            .map(|_| ())
    }

    /// Writes any length, in requests of at most 1 MiB.
    pub fn write_all(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        for (i, chunk) in data.chunks(1 << 20).enumerate() {
            self.write(offset + (i << 20) as u64, chunk, false)?;
        }
        Ok(())
    }

    pub fn write_zeroes(&mut self, offset: u64, len: u32, fua: bool) -> Result<()> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.request(CMD_WRITE_ZEROES, flags, offset, len, None)
            .map(|_| ())
    }

    pub fn flush(&mut self) -> Result<()> {
        self.request(CMD_FLUSH, 0, 0, 0, None).map(|_| ())
    }

    /// The connection after the handshake, for a test that drives the
    /// transmission phase itself (several requests in flight).
    pub fn into_stream(self) -> UnixStream {
        self.sock
    }

    /// Polite goodbye (NBD_CMD_DISC); errors ignored.
    pub fn disconnect(mut self) {
        let _ = self.request(CMD_DISC, 0, 0, 0, None);
    }
}
