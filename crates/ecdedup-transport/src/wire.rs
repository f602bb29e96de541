//! Frames on an async byte stream: the same checks as
//! [`ecdedup_core::proto::read_frame`] (header first, then the payload the
//! header announces, each under its CRC), on tokio's `AsyncRead`.
//!
//! The header is read and checked before anything is allocated for its
//! payload, so a caller can bound a payload tighter than the protocol does
//! (the handshake does) between [`read_header`] and [`read_payload`].

use ecdedup_core::proto::{FrameError, Header, HEADER_BYTES};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Fills `buf`; `Truncated` when the stream ends first.
async fn fill<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> Result<(), FrameError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]).await {
            Ok(0) => {
                return Err(FrameError::Truncated {
                    want: buf.len(),
                    got,
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e.kind())),
        }
    }
    Ok(())
}

/// Reads and checks one header; `Ok(None)` at a clean end of stream (no
/// byte of a next frame).
pub async fn read_header<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Header>, FrameError> {
    let mut b = [0u8; HEADER_BYTES];
    match fill(r, &mut b).await {
        Err(FrameError::Truncated { got: 0, .. }) => return Ok(None),
        other => other?,
    }
    Header::decode(&b).map(Some)
}

/// Reads the payload `header` announced into `payload` and checks its CRC.
pub async fn read_payload<R: AsyncRead + Unpin>(
    r: &mut R,
    header: &Header,
    payload: &mut Vec<u8>,
) -> Result<(), FrameError> {
    payload.clear();
    payload.resize(header.payload_bytes as usize, 0);
    fill(r, payload).await?;
    header.check_payload(payload)
}

/// Reads one whole frame: [`read_header`], then [`read_payload`].
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    payload: &mut Vec<u8>,
) -> Result<Option<Header>, FrameError> {
    let Some(header) = read_header(r).await? else {
        return Ok(None);
    };
    read_payload(r, &header, payload).await?;
    Ok(Some(header))
}

/// Writes one frame (not flushed). `header` must announce `payload`.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    header: &Header,
    payload: &[u8],
) -> std::io::Result<()> {
    debug_assert_eq!(payload.len(), header.payload_bytes as usize);
    w.write_all(&header.encode()).await?;
    w.write_all(payload).await
}

/// A frame waiting in a connection's send queue.
pub type Queued = (Header, Vec<u8>);

/// Writes the frames of `queue` until it is closed and empty, flushing
/// whenever it runs dry (so that frames queued together leave in one
/// write). Ends with the stream's error, if one comes first.
pub async fn write_queued<W: AsyncWrite + Unpin>(
    w: W,
    queue: &mut tokio::sync::mpsc::Receiver<Queued>,
) -> std::io::Result<()> {
    let mut w = tokio::io::BufWriter::new(w);
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        while let Some((header, payload)) = next {
            write_frame(&mut w, &header, &payload).await?;
            next = queue.try_recv().ok();
        }
        w.flush().await?;
    }
    Ok(())
}
