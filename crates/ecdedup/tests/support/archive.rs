//! The archive tier's tests share one small geometry builder.

use ecdedup::archive::CreateOptions;
use ecdedup::fingerprint::Algorithm;

/// Options for a small test archive: MD5, a 1 MiB fingerprint cache,
/// `device_count` folders inside the archive folder.
pub fn options(
    k: usize,
    m: usize,
    block_bytes: usize,
    device_count: usize,
    container_bytes: u64,
    exchange: u32,
) -> CreateOptions {
    CreateOptions {
        k,
        m,
        devices: Vec::new(),
        device_count,
        container_bytes,
        block_bytes: block_bytes as u32,
        fingerprint: Algorithm::Md5,
        cache_bytes: 1 << 20,
        exchange,
        verify: None,
    }
}
