//! Whether an ELF library file is whole, checked before the dynamic loader
//! maps it.
//!
//! The loader maps a library's segments where its program headers say they
//! are. In a file cut short (copied while still being written, say) they
//! run past its end, and the first touch of such a page kills the process
//! with `SIGBUS`: no error comes back to refuse it with. So every segment
//! and header table is checked to lie within the file first. A file that is
//! not ELF at all is left to the loader, which refuses it cleanly.

use std::io::{Read, Seek, SeekFrom};

/// What makes a library file unsafe to map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incomplete {
    Header,
    ProgramHeaders,
    Segment { index: usize, end: u64, len: u64 },
    SectionHeaders,
}

impl std::fmt::Display for Incomplete {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Incomplete::Header => f.write_str("its ELF header is cut short"),
            Incomplete::ProgramHeaders => {
                f.write_str("its program headers end past the file's end")
            }
            Incomplete::Segment { index, end, len } => write!(
                f,
                "segment {index} ends at byte {end}, past the file's {len}"
            ),
            Incomplete::SectionHeaders => {
                f.write_str("its section headers end past the file's end")
            }
        }
    }
}

/// At most this many program headers are read; real libraries have about
/// ten.
const MAX_PROGRAM_HEADERS: u64 = 4096;

/// Checks the ELF file `file` of `len` bytes; `Ok` for a file that is not
/// ELF (the loader's to refuse).
pub fn check(file: &mut (impl Read + Seek), len: u64) -> Result<(), Incomplete> {
    let mut ident = [0u8; 16];
    if len < 16 {
        return Ok(());
    }
    read_at(file, 0, &mut ident).map_err(|_| Incomplete::Header)?;
    if ident[..4] != *b"\x7fELF" {
        return Ok(());
    }
    let wide = match ident[4] {
        1 => false,
        2 => true,
        _ => return Err(Incomplete::Header),
    };
    let little = match ident[5] {
        1 => true,
        2 => false,
        _ => return Err(Incomplete::Header),
    };
    let fields = Fields { wide, little };
    let header_len = if wide { 64 } else { 52 };
    if len < header_len {
        return Err(Incomplete::Header);
    }
    let mut header = [0u8; 64];
    read_at(file, 0, &mut header[..header_len as usize]).map_err(|_| Incomplete::Header)?;
    // Offsets of e_phoff, e_shoff, e_phentsize, e_phnum, e_shentsize, e_shnum.
    let (phoff, shoff, sizes) = if wide { (32, 40, 54) } else { (28, 32, 42) };
    let phoff = fields.word(&header, phoff);
    let shoff = fields.word(&header, shoff);
    let phentsize = u64::from(fields.half(&header, sizes));
    let phnum = u64::from(fields.half(&header, sizes + 2));
    let shentsize = u64::from(fields.half(&header, sizes + 4));
    let shnum = u64::from(fields.half(&header, sizes + 6));

    let table_end = |offset: u64, size: u64, count: u64| {
        size.checked_mul(count)
            .and_then(|bytes| offset.checked_add(bytes))
    };
    let program_end = table_end(phoff, phentsize, phnum);
    let entry_len = if wide { 56 } else { 32 };
    if phnum > MAX_PROGRAM_HEADERS
        || (phnum > 0 && phentsize < entry_len)
        || program_end.is_none_or(|end| end > len)
    {
        return Err(Incomplete::ProgramHeaders);
    }
    if shoff != 0 && table_end(shoff, shentsize, shnum).is_none_or(|end| end > len) {
        return Err(Incomplete::SectionHeaders);
    }
    let mut entry = [0u8; 56];
    for index in 0..phnum {
        let at = phoff + index * phentsize;
        read_at(file, at, &mut entry[..entry_len as usize])
            .map_err(|_| Incomplete::ProgramHeaders)?;
        // p_offset and p_filesz.
        let (offset, size) = if wide {
            (fields.word(&entry, 8), fields.word(&entry, 32))
        } else {
            (fields.word(&entry, 4), fields.word(&entry, 16))
        };
        let end = offset.saturating_add(size);
        if size > 0 && end > len {
            return Err(Incomplete::Segment {
                index: index as usize,
                end,
                len,
            });
        }
    }
    Ok(())
}

fn read_at(file: &mut (impl Read + Seek), at: u64, buf: &mut [u8]) -> std::io::Result<()> {
    file.seek(SeekFrom::Start(at))?;
    file.read_exact(buf)
}

/// How the file's numbers are written: 32 or 64 bits, which byte first.
struct Fields {
    wide: bool,
    little: bool,
}

impl Fields {
    fn half(&self, bytes: &[u8], at: usize) -> u16 {
        let b = [bytes[at], bytes[at + 1]];
        if self.little {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        }
    }

    /// An address or offset: 8 bytes in a 64-bit file, 4 in a 32-bit one.
    fn word(&self, bytes: &[u8], at: usize) -> u64 {
        if self.wide {
            let b: [u8; 8] = bytes[at..at + 8].try_into().expect("8 bytes");
            if self.little {
                u64::from_le_bytes(b)
            } else {
                u64::from_be_bytes(b)
            }
        } else {
            let b: [u8; 4] = bytes[at..at + 4].try_into().expect("4 bytes");
            u64::from(if self.little {
                u32::from_le_bytes(b)
            } else {
                u32::from_be_bytes(b)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// This test's own executable: a whole ELF file on Linux.
    fn whole() -> Vec<u8> {
        std::fs::read(std::env::current_exe().expect("the test binary")).expect("readable")
    }

    fn check_bytes(bytes: &[u8]) -> Result<(), Incomplete> {
        check(&mut Cursor::new(bytes), bytes.len() as u64)
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_whole_file_passes_and_every_cut_fails() {
        let bytes = whole();
        assert_eq!(check_bytes(&bytes), Ok(()));
        for keep in [20, 63, 64, 100, 4096, bytes.len() / 2, bytes.len() - 1] {
            assert!(
                check_bytes(&bytes[..keep]).is_err(),
                "cut to {keep} of {} bytes",
                bytes.len()
            );
        }
    }

    #[test]
    fn what_is_not_elf_is_left_to_the_loader() {
        assert_eq!(check_bytes(b""), Ok(()));
        assert_eq!(check_bytes(b"#!/bin/sh\necho not a library\n"), Ok(()));
        assert_eq!(check_bytes(b"\x7fEL"), Ok(()));
        assert_eq!(
            check_bytes(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x03\0"),
            Err(Incomplete::Header)
        );
    }
}
