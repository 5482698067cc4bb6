//! A bounds-checked little-endian reader over a byte slice: every read names what it reads, so a
//! truncated file reports which structure was cut.

use crate::{Error, Result};

/// Reads little-endian scalars and GGUF strings from a byte slice, never past its end.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    /// Current byte offset.
    pub(crate) fn pos(&self) -> u64 {
        self.pos as u64
    }

    /// Bytes left after the current offset.
    pub(crate) fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// Takes the next `n` bytes.
    pub(crate) fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(Error::Truncated {
                what: what(),
                offset: self.pos(),
                needed: n,
                available: self.remaining(),
            });
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: impl FnOnce() -> String) -> Result<[u8; N]> {
        let bytes = self.take(N as u64, what)?;
        Ok(bytes.try_into().expect("take returned N bytes"))
    }

    pub(crate) fn u8(&mut self, what: impl FnOnce() -> String) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(crate) fn u16(&mut self, what: impl FnOnce() -> String) -> Result<u16> {
        self.array(what).map(u16::from_le_bytes)
    }
    pub(crate) fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }
    pub(crate) fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: u64 length, then that many UTF-8 bytes.
    pub(crate) fn string(&mut self, what: impl Fn() -> String) -> Result<&'a str> {
        let offset = self.pos();
        let len = self.u64(|| format!("length of {}", what()))?;
        let bytes = self.take(len, &what)?;
        std::str::from_utf8(bytes)
            .map_err(|e| Error::invalid_gguf(offset, format!("{} is not valid UTF-8: {e}", what())))
    }
}
