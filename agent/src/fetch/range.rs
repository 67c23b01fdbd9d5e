//! Bounded Range requests: a file read at offsets (a release bundle on a
//! web server) without downloading it whole.
//!
//! Every request names its last byte; only a `206` whose `Content-Range`
//! matches the request is accepted, and a server that answers `200` (it
//! ignored the Range header) is refused rather than read whole. The
//! transport rules (https, origins, caps, the slow-retrieval floor) are
//! the parent module's and apply unchanged.

use super::*;

/// What a `206 Partial Content` answer said about the whole resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeInfo {
    /// The resource's size (the complete length in `Content-Range`).
    pub total: u64,
    /// Its `ETag`, if the server sent one.
    pub etag: Option<String>,
}

/// Outcome of [`Fetcher::get_range`].
#[derive(Debug)]
pub enum Ranged {
    /// 304: the resource still has the ETag sent with the request.
    NotModified,
    /// 206: the bytes asked for (fewer only where the resource ends).
    Part { bytes: Vec<u8>, info: RangeInfo },
}

/// Bounded Range requests, for a file read at offsets (a release bundle
/// on a web server). Every request names its last byte; only a 206 whose
/// `Content-Range` matches the request is accepted, and a server that
/// answers 200 (it ignored the Range header) is refused rather than read
/// whole.
impl Fetcher {
    /// GET bytes `start .. start + len` of `url` (`len` > 0): the small
    /// reads of a bundle's headers, manifest and key documents, under the
    /// slow-retrieval floor but not the bandwidth cap. The answer may end
    /// early only where the resource does. With `etag`, the request is
    /// conditional (`If-None-Match`) and a 304 is [`Ranged::NotModified`].
    pub fn get_range(&self, url: &str, start: u64, len: u64, etag: Option<&str>) -> Result<Ranged> {
        let last = range_last(url, start, len)?;
        let mut headers = vec![("Range", format!("bytes={start}-{last}"))];
        if let Some(tag) = etag {
            headers.push(("If-None-Match", tag.to_string()));
        }
        let (url, resp) = self.get(url, &headers)?;
        let url = url.as_str();
        let status = resp.status().as_u16();
        if status == 304 && etag.is_some() {
            return Ok(Ranged::NotModified);
        }
        let (info, n) = check_partial(url, status, resp.headers(), start, last, true)?;
        let mut body = resp.into_body();
        let mut reader = body.as_reader();
        let mut bytes = Vec::with_capacity(usize::try_from(n).unwrap_or(0).min(1 << 20));
        let mut limited = (&mut reader).take(n + 1);
        let mut guard = RateGuard::new(self.min_rate, self.min_rate_window);
        let mut buf = [0u8; 16 * 1024];
        loop {
            let got = limited.read(&mut buf).map_err(|e| io_net_error(url, e))?;
            if got == 0 {
                break;
            }
            bytes.extend_from_slice(&buf[..got]);
            guard
                .add(got as u64)
                .map_err(|e| e.wrap(format!("GET {}", truncate(url, 200))))?;
        }
        if bytes.len() as u64 != n {
            bail!(
                Network,
                "GET {} (bytes {start}-{last}): the body holds {} bytes, the Content-Range {n}",
                truncate(url, 200),
                bytes.len()
            );
        }
        self.counters.body_bytes.fetch_add(n, Ordering::Relaxed);
        Ok(Ranged::Part { bytes, info })
    }

    /// Open bytes `start .. start + len` of `url` (`len` > 0) as an
    /// artifact body: one bounded Range request, a 206 for exactly that
    /// range required. The reader yields exactly `len` bytes or fails,
    /// under the slow-retrieval floor and the bandwidth cap like
    /// [`Fetcher::open`].
    pub fn open_range(
        &self,
        url: &str,
        start: u64,
        len: u64,
    ) -> Result<(RangeDownload, RangeInfo)> {
        let last = range_last(url, start, len)?;
        let headers = [("Range", format!("bytes={start}-{last}"))];
        let (url, resp) = self.get(url, &headers)?;
        let url = url.as_str();
        let status = resp.status().as_u16();
        let (info, _) = check_partial(url, status, resp.headers(), start, last, false)?;
        let dl = self.download(url, resp, len);
        Ok((RangeDownload { dl }, info))
    }
}

/// A body opened by [`Fetcher::open_range`]: a [`Download`] that, once it
/// has delivered its last byte, reads the response to its end, so that
/// the connection goes back to the pool and the next range (the next part
/// of a bundle's artifact) is asked for on it.
pub struct RangeDownload {
    dl: Download,
}

impl Read for RangeDownload {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.dl.read(buf)?;
        if n > 0 && self.dl.remaining == 0 {
            // The Content-Length was checked: this read returns 0 at once
            // and lets the HTTP client see the end of the body.
            let mut probe = [0u8; 1];
            let _ = self.dl.reader.read(&mut probe);
        }
        Ok(n)
    }
}

/// The last byte of the range `start .. start + len`.
fn range_last(url: &str, start: u64, len: u64) -> Result<u64> {
    if len == 0 {
        bail!(
            Network,
            "GET {}: an empty range at {start} cannot be asked for",
            truncate(url, 200)
        );
    }
    start.checked_add(len - 1).ok_or_else(|| {
        err!(
            Network,
            "GET {}: the range of {len} bytes at {start} overflows",
            truncate(url, 200)
        )
    })
}

/// Check the answer to a request for bytes `start..=last`: a 206 whose
/// `Content-Range` starts at `start`, ends at `last` (or, when `short_ok`,
/// earlier where the resource ends) and names the resource's size, and
/// whose `Content-Length`, if any, agrees. Returns what it says and the
/// number of body bytes to expect.
fn check_partial(
    url: &str,
    status: u16,
    h: &ureq::http::HeaderMap,
    start: u64,
    last: u64,
    short_ok: bool,
) -> Result<(RangeInfo, u64)> {
    let u = truncate(url, 200);
    match status {
        206 => {}
        200 => bail!(
            Network,
            "GET {u}: the server ignored the Range request for bytes {start}-{last} (it answered \
             200 with the whole file); a bundle is read by Range requests, so it must be served \
             by a server that honours them"
        ),
        416 => bail!(
            Network,
            "GET {u}: the server cannot serve bytes {start}-{last} (416): the file is shorter \
             than that, or it changed on the server"
        ),
        _ => {
            check_status("GET", url, status, h)?;
            bail!(
                Network,
                "GET {u}: unexpected status {status} to a Range request"
            );
        }
    }
    let raw = h
        .get("content-range")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some((first, end, total)) = parse_content_range(raw) else {
        bail!(
            Network,
            "GET {u}: 206 with the Content-Range {:?}, not `bytes FIRST-LAST/SIZE`",
            truncate(raw, 100)
        );
    };
    let ends_well = end == last || (short_ok && end < last && end + 1 == total);
    if first != start || !ends_well || end >= total {
        bail!(
            Network,
            "GET {u}: asked for bytes {start}-{last}, the server sent {first}-{end} of {total}"
        );
    }
    let n = end - first + 1;
    if let Some(len) = content_length(h).filter(|&len| len != n) {
        bail!(
            Network,
            "GET {u}: the Content-Range {first}-{end} holds {n} bytes, the Content-Length says {len}"
        );
    }
    let etag = h
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    Ok((RangeInfo { total, etag }, n))
}

/// `bytes FIRST-LAST/SIZE` with a known size, FIRST ≤ LAST.
pub(super) fn parse_content_range(v: &str) -> Option<(u64, u64, u64)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let digits = |s: &str| {
        let s = s.trim();
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    let (first, last, total) = (digits(first)?, digits(last)?, digits(total)?);
    (first <= last).then_some((first, last, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_need_a_known_size() {
        assert_eq!(parse_content_range("bytes 0-99/1000"), Some((0, 99, 1000)));
        assert_eq!(
            parse_content_range(" bytes 4294967296-4294967299/9000000000"),
            Some((4294967296, 4294967299, 9000000000))
        );
        assert_eq!(parse_content_range("bytes 0-99/*"), None);
        assert_eq!(parse_content_range("bytes */1000"), None);
        assert_eq!(parse_content_range("bytes 9-3/1000"), None);
        assert_eq!(parse_content_range("bytes -5-9/1000"), None);
        assert_eq!(parse_content_range("items 0-9/10"), None);
        assert_eq!(parse_content_range(""), None);
    }
}
