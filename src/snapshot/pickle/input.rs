//! The byte source the unpickler reads from: a large buffer refilled from any reader, with
//! the byte offset of every position (for error messages) and a guaranteed look-ahead window
//! that lets the trace-event fast path parse one event from a slice and back out cleanly.

use std::io::Read;

/// Bytes kept in memory at once.
const BUFFER: usize = 1 << 20;

/// Why reading stopped.
#[derive(Debug)]
pub enum InputError {
    /// The data ended although the pickle needs more (a truncated file).
    Eof {
        /// Offset at which more bytes were needed.
        offset: u64,
    },
    /// The reader failed.
    Io(std::io::Error),
}

/// A buffered byte reader that knows its offset in the whole stream.
pub struct Input<R> {
    reader: R,
    buffer: Vec<u8>,
    /// Next unread byte in `buffer`.
    at: usize,
    /// End of the valid bytes in `buffer`.
    end: usize,
    /// Stream offset of `buffer[0]`.
    base: u64,
    /// Whether the reader has reported its end.
    exhausted: bool,
    /// A long argument (a string larger than the window) is copied here.
    scratch: Vec<u8>,
}

impl<R: Read> Input<R> {
    /// Reads from `reader`.
    pub fn new(reader: R) -> Input<R> {
        Input {
            reader,
            buffer: vec![0; BUFFER],
            at: 0,
            end: 0,
            base: 0,
            exhausted: false,
            scratch: Vec::new(),
        }
    }

    /// Offset of the next unread byte.
    #[inline]
    pub fn offset(&self) -> u64 {
        self.base + self.at as u64
    }

    /// The unread bytes in the buffer (at least `want` of them unless the stream ends first).
    pub fn window(&mut self, want: usize) -> Result<&[u8], InputError> {
        if self.end - self.at < want {
            self.refill()?;
        }
        Ok(&self.buffer[self.at..self.end])
    }

    /// Marks `count` bytes of the window as read.
    #[inline]
    pub fn advance(&mut self, count: usize) {
        self.at += count;
    }

    /// Moves the unread bytes to the front and reads until the buffer is full or the stream
    /// ends.
    fn refill(&mut self) -> Result<(), InputError> {
        self.buffer.copy_within(self.at..self.end, 0);
        self.base += self.at as u64;
        self.end -= self.at;
        self.at = 0;
        while self.end < self.buffer.len() && !self.exhausted {
            match self.reader.read(&mut self.buffer[self.end..]) {
                Ok(0) => self.exhausted = true,
                Ok(count) => self.end += count,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => return Err(InputError::Io(error)),
            }
        }
        Ok(())
    }

    /// The next byte.
    #[inline]
    pub fn byte(&mut self) -> Result<u8, InputError> {
        if self.at == self.end {
            self.refill()?;
            if self.at == self.end {
                return Err(InputError::Eof {
                    offset: self.offset(),
                });
            }
        }
        let byte = self.buffer[self.at];
        self.at += 1;
        Ok(byte)
    }

    /// The next byte, or `None` at the end of the stream.
    pub fn byte_or_end(&mut self) -> Result<Option<u8>, InputError> {
        match self.byte() {
            Ok(byte) => Ok(Some(byte)),
            Err(InputError::Eof { .. }) => Ok(None),
            Err(other) => Err(other),
        }
    }

    /// The next `count` bytes.
    pub fn take(&mut self, count: usize) -> Result<&[u8], InputError> {
        if self.end - self.at >= count {
            let start = self.at;
            self.at += count;
            return Ok(&self.buffer[start..start + count]);
        }
        if count <= self.buffer.len() / 2 {
            self.refill()?;
            if self.end - self.at < count {
                return Err(InputError::Eof {
                    offset: self.base + self.end as u64,
                });
            }
            let start = self.at;
            self.at += count;
            return Ok(&self.buffer[start..start + count]);
        }
        // Longer than the window: copy piece by piece.
        self.scratch.clear();
        while self.scratch.len() < count {
            if self.at == self.end {
                self.refill()?;
                if self.at == self.end {
                    return Err(InputError::Eof {
                        offset: self.offset(),
                    });
                }
            }
            let piece = (count - self.scratch.len()).min(self.end - self.at);
            self.scratch
                .extend_from_slice(&self.buffer[self.at..self.at + piece]);
            self.at += piece;
        }
        Ok(&self.scratch)
    }

    /// The next `N` bytes as an array.
    #[inline]
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], InputError> {
        let mut out = [0_u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// Bytes up to (not including) the next newline, which is consumed (protocol 0 arguments).
    pub fn line(&mut self) -> Result<Vec<u8>, InputError> {
        let mut line = Vec::new();
        loop {
            match self.byte()? {
                b'\n' => return Ok(line),
                byte => line.push(byte),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_across_refills_and_reports_the_end() {
        let data: Vec<u8> = (0..=255).cycle().take(3 * BUFFER + 17).collect();
        let mut input = Input::new(&data[..]);
        assert_eq!(input.byte().ok(), Some(0));
        let long = input.take(2 * BUFFER).map(|s| s.len()).ok();
        assert_eq!(long, Some(2 * BUFFER));
        assert_eq!(input.offset(), 2 * BUFFER as u64 + 1);
        let rest = input.take(BUFFER + 16).map(|s| s.to_vec()).ok();
        assert_eq!(rest.map(|r| r.len()), Some(BUFFER + 16));
        assert!(matches!(input.byte(), Err(InputError::Eof { .. })));
        assert!(matches!(input.byte_or_end(), Ok(None)));
    }

    #[test]
    fn window_looks_ahead_without_consuming() {
        let mut input = Input::new(&b"abc\nde"[..]);
        assert_eq!(input.window(3).ok().map(|w| w.len()), Some(6));
        assert_eq!(input.line().ok(), Some(b"abc".to_vec()));
        assert_eq!(input.array::<2>().ok(), Some(*b"de"));
    }
}
