//! The byte source the unpickler reads from: a large buffer refilled from any reader, with
//! the byte offset of every position (for error messages) and a guaranteed look-ahead window
//! that lets the trace-event fast path parse one event from a slice and back out cleanly.
//!
//! When the stream's size is known (a file), a length the pickle declares is checked against
//! the bytes left before anything is allocated for it; when it is not, a long argument is read
//! piece by piece, so memory follows the bytes that really are there.

use std::io::Read;

/// Bytes kept in memory at once. Small enough that the buffer, rewritten by every `read`,
/// leaves most of a core's L2 cache to the replay's tables (a 1 MiB buffer evicted them:
/// `perf` showed the replay's hash lookups missing the cache); large enough that a `read` per
/// 256 KiB costs nothing.
const BUFFER: usize = 256 << 10;

/// The smallest buffer: room for any fixed-size argument twice over.
const SMALLEST_BUFFER: usize = 64;

/// Why reading stopped.
#[derive(Debug)]
pub enum InputError {
    /// The data ended although the pickle needs more (a truncated file).
    Eof {
        /// Offset at which more bytes were needed.
        offset: u64,
    },
    /// The pickle declares an argument longer than what is left of the file.
    TooLong {
        /// Offset of the argument's first byte.
        offset: u64,
        /// Bytes declared.
        declared: u64,
        /// Bytes left in the file.
        left: u64,
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
    /// The stream's size, when known.
    size: Option<u64>,
}

impl<R: Read> Input<R> {
    /// Reads from `reader`, whose size is not known.
    pub fn new(reader: R) -> Input<R> {
        Input::with_size(reader, None)
    }

    /// Reads from `reader`, which holds `size` bytes when that is known.
    pub fn with_size(reader: R, size: Option<u64>) -> Input<R> {
        Input {
            reader,
            buffer: Vec::new(),
            at: 0,
            end: 0,
            base: 0,
            exhausted: false,
            size,
        }
    }

    /// Tells the input the stream's size (`None`: unknown).
    pub fn set_size(&mut self, size: Option<u64>) {
        self.size = size;
    }

    /// The stream's size, when known.
    pub fn size(&self) -> Option<u64> {
        self.size
    }

    /// Refuses an argument of `count` bytes longer than what is left of a stream of known size.
    fn check_declared(&self, count: usize) -> Result<(), InputError> {
        let Some(size) = self.size else {
            return Ok(());
        };
        let left = size.saturating_sub(self.offset());
        if count as u64 > left {
            return Err(InputError::TooLong {
                offset: self.offset(),
                declared: count as u64,
                left,
            });
        }
        Ok(())
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

    /// The buffer's length: [`BUFFER`], or less for a stream known to be smaller (the whole
    /// of it then fits).
    fn buffer_len(&self) -> usize {
        match self.size {
            Some(size) => usize::try_from(size)
                .unwrap_or(BUFFER)
                .saturating_add(1)
                .clamp(SMALLEST_BUFFER, BUFFER),
            None => BUFFER,
        }
    }

    /// Moves the unread bytes to the front and reads until the buffer is full or the stream
    /// ends.
    fn refill(&mut self) -> Result<(), InputError> {
        if self.buffer.is_empty() {
            self.buffer = vec![0; self.buffer_len()];
        }
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

    /// The next `count` bytes, borrowed; `count` must be at most half the buffer (the fixed
    /// arguments of opcodes and short strings).
    pub fn take(&mut self, count: usize) -> Result<&[u8], InputError> {
        if self.end - self.at < count {
            if count > self.buffer_len() / 2 {
                return Err(InputError::TooLong {
                    offset: self.offset(),
                    declared: count as u64,
                    left: 0,
                });
            }
            self.refill()?;
            if self.end - self.at < count {
                return Err(InputError::Eof {
                    offset: self.base + self.end as u64,
                });
            }
        }
        let start = self.at;
        self.at += count;
        Ok(&self.buffer[start..start + count])
    }

    /// The next `count` bytes, owned: a length the pickle declared, checked against what is
    /// left of the stream first; a long one is read piece by piece.
    pub fn take_vec(&mut self, count: usize) -> Result<Vec<u8>, InputError> {
        self.check_declared(count)?;
        if count <= self.buffer_len() / 2 {
            return self.take(count).map(<[u8]>::to_vec);
        }
        let mut bytes = Vec::new();
        while bytes.len() < count {
            if self.at == self.end {
                self.refill()?;
                if self.at == self.end {
                    return Err(InputError::Eof {
                        offset: self.offset(),
                    });
                }
            }
            let piece = (count - bytes.len()).min(self.end - self.at);
            bytes.extend_from_slice(&self.buffer[self.at..self.at + piece]);
            self.at += piece;
        }
        Ok(bytes)
    }

    /// Skips the next `count` bytes (an argument the reader does not keep), checked against
    /// what is left of the stream first.
    pub fn skip(&mut self, count: u64) -> Result<(), InputError> {
        let declared = usize::try_from(count).unwrap_or(usize::MAX);
        self.check_declared(declared)?;
        let mut left = count;
        while left > 0 {
            if self.at == self.end {
                self.refill()?;
                if self.at == self.end {
                    return Err(InputError::Eof {
                        offset: self.offset(),
                    });
                }
            }
            let piece = usize::try_from(left)
                .unwrap_or(usize::MAX)
                .min(self.end - self.at);
            self.at += piece;
            left -= piece as u64;
        }
        Ok(())
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
        let long = input.take_vec(2 * BUFFER).map(|s| s.len()).ok();
        assert_eq!(long, Some(2 * BUFFER));
        assert_eq!(input.offset(), 2 * BUFFER as u64 + 1);
        assert!(input.skip(10).is_ok());
        let rest = input.take_vec(BUFFER + 6).map(|s| s.to_vec()).ok();
        assert_eq!(rest.map(|r| r.len()), Some(BUFFER + 6));
        assert!(matches!(input.byte(), Err(InputError::Eof { .. })));
    }

    #[test]
    fn a_declared_length_past_the_end_is_refused_before_reading() {
        let data = [7_u8; 100];
        let mut input = Input::with_size(&data[..], Some(100));
        assert!(input.skip(10).is_ok());
        match input.take_vec(usize::MAX / 2) {
            Err(InputError::TooLong {
                offset,
                declared,
                left,
            }) => assert_eq!((offset, declared, left), (10, usize::MAX as u64 / 2, 90)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            input.skip(91),
            Err(InputError::TooLong { left: 90, .. })
        ));
        assert_eq!(input.take_vec(90).map(|v| v.len()).ok(), Some(90));
        // A stream of unknown size reads what is there and then reports the end.
        let mut input = Input::new(&data[..]);
        assert!(matches!(
            input.take_vec(3 * BUFFER),
            Err(InputError::Eof { offset: 100 })
        ));
    }

    #[test]
    fn window_looks_ahead_without_consuming() {
        let mut input = Input::new(&b"abc\nde"[..]);
        assert_eq!(input.window(3).ok().map(|w| w.len()), Some(6));
        assert_eq!(input.line().ok(), Some(b"abc".to_vec()));
        assert_eq!(input.array::<2>().ok(), Some(*b"de"));
    }
}
