//! A small NBD client over a Unix socket, enough for the experiments: fixed
//! newstyle handshake with NBD_OPT_GO on the default export, simple replies,
//! one request in flight. One request at a time makes a sequential stream
//! whose order the array sees exactly as written, so its counters are
//! deterministic.

use ecdedup_core::error::{Error, Result};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const INFO_EXPORT: u16 = 0;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;

/// The largest request this client sends (nbdkit accepts up to 64 MiB).
pub const REQUEST_BYTES_MAX: usize = 32 << 20;
const IO_TIMEOUT: Duration = Duration::from_secs(600);

pub struct Client {
    sock: UnixStream,
    /// Export size in bytes.
    pub size: u64,
    next_handle: u64,
}

fn io(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(format!("NBD {what}"), e)
}

fn proto(msg: String) -> Error {
    Error::Other(format!("NBD protocol: {msg}"))
}

impl Client {
    pub fn connect(socket: &Path) -> Result<Client> {
        let sock = UnixStream::connect(socket)
            .map_err(|e| Error::io(format!("connecting to {}", socket.display()), e))?;
        sock.set_read_timeout(Some(IO_TIMEOUT)).ok();
        sock.set_write_timeout(Some(IO_TIMEOUT)).ok();
        let mut c = Client {
            sock,
            size: 0,
            next_handle: 1,
        };
        c.handshake()?;
        Ok(c)
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
        self.sock.read_exact(buf).map_err(io("read"))
    }
    fn u16(&mut self) -> Result<u16> {
        let mut b = [0u8; 2];
        self.read_exact(&mut b)?;
        Ok(u16::from_be_bytes(b))
    }
    fn u32(&mut self) -> Result<u32> {
        let mut b = [0u8; 4];
        self.read_exact(&mut b)?;
        Ok(u32::from_be_bytes(b))
    }
    fn u64(&mut self) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read_exact(&mut b)?;
        Ok(u64::from_be_bytes(b))
    }

    fn handshake(&mut self) -> Result<()> {
        if self.u64()? != NBDMAGIC || self.u64()? != IHAVEOPT {
            return Err(proto("not a newstyle NBD server".into()));
        }
        let hs = self.u16()?;
        if hs & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(proto("server is not fixed newstyle".into()));
        }
        let mut msg = Vec::new();
        msg.extend_from_slice(
            &((hs & (FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES)) as u32).to_be_bytes(),
        );
        msg.extend_from_slice(&IHAVEOPT.to_be_bytes());
        msg.extend_from_slice(&OPT_GO.to_be_bytes());
        msg.extend_from_slice(&6u32.to_be_bytes()); // name length 0 + info count 0
        msg.extend_from_slice(&0u32.to_be_bytes());
        msg.extend_from_slice(&0u16.to_be_bytes());
        ecdedup_core::control::SocketWriter(&self.sock)
            .write_all(&msg)
            .map_err(io("write"))?;
        let mut size = None;
        loop {
            if self.u64()? != OPT_REPLY_MAGIC {
                return Err(proto("bad option reply magic".into()));
            }
            let _opt = self.u32()?;
            let typ = self.u32()?;
            let len = self.u32()? as usize;
            if len > 1 << 20 {
                return Err(proto(format!("option reply of {len} bytes")));
            }
            let mut data = vec![0u8; len];
            self.read_exact(&mut data)?;
            match typ {
                REP_ACK => break,
                REP_INFO if len >= 12 && u16::from_be_bytes([data[0], data[1]]) == INFO_EXPORT => {
                    size = Some(u64::from_be_bytes(data[2..10].try_into().unwrap()));
                }
                t if t & 0x8000_0000 != 0 => {
                    return Err(proto(format!(
                        "NBD_OPT_GO refused ({t:#x}): {}",
                        String::from_utf8_lossy(&data)
                    )))
                }
                _ => {}
            }
        }
        self.size = size.ok_or_else(|| proto("no export size before ACK".into()))?;
        Ok(())
    }

    fn request(&mut self, typ: u16, offset: u64, len: u32, payload: Option<&[u8]>) -> Result<()> {
        let handle = self.next_handle;
        self.next_handle += 1;
        let mut hdr = Vec::with_capacity(28);
        hdr.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        hdr.extend_from_slice(&0u16.to_be_bytes());
        hdr.extend_from_slice(&typ.to_be_bytes());
        hdr.extend_from_slice(&handle.to_be_bytes());
        hdr.extend_from_slice(&offset.to_be_bytes());
        hdr.extend_from_slice(&len.to_be_bytes());
        ecdedup_core::control::SocketWriter(&self.sock)
            .write_all(&hdr)
            .map_err(io("write"))?;
        if let Some(p) = payload {
            ecdedup_core::control::SocketWriter(&self.sock)
                .write_all(p)
                .map_err(io("write"))?;
        }
        if typ == CMD_DISC {
            return Ok(());
        }
        if self.u32()? != SIMPLE_REPLY_MAGIC {
            return Err(proto("bad reply magic".into()));
        }
        let error = self.u32()?;
        if self.u64()? != handle {
            return Err(proto("reply for another request".into()));
        }
        if error != 0 {
            return Err(Error::Other(format!(
                "NBD server answered error {error} ({}) to a request at offset {offset}",
                std::io::Error::from_raw_os_error(error as i32)
            )));
        }
        Ok(())
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        assert!(data.len() <= REQUEST_BYTES_MAX);
        self.request(CMD_WRITE, offset, data.len() as u32, Some(data))
    }

    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        assert!(buf.len() <= REQUEST_BYTES_MAX);
        self.request(CMD_READ, offset, buf.len() as u32, None)?;
        self.read_exact(buf)
    }

    pub fn flush(&mut self) -> Result<()> {
        self.request(CMD_FLUSH, 0, 0, None)
    }

    /// Polite goodbye; the connection closes when the client is dropped.
    pub fn disconnect(mut self) {
        let _ = self.request(CMD_DISC, 0, 0, None);
    }
}
