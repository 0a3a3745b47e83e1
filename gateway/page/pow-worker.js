// The waiting room's proof of work, solved off the page's thread: given
// {challenge, difficulty}, find a nonce such that
// SHA-256(challenge + ":" + nonce) starts with difficulty zero bits, and
// post back {nonce, tries, ms}. SHA-256 is written out here: one
// synchronous hash of a short message costs about a microsecond, where
// crypto.subtle's promise per hash costs several.
"use strict";
var K = new Int32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2]);
var W = new Int32Array(64);

// firstWord is the first 32 bits of SHA-256(bytes[0:n]); bytes has room
// for the padding. The first 32 bits decide any difficulty up to 32.
function firstWord(bytes, n) {
  var padded = ((n + 9 + 63) >> 6) << 6;
  bytes[n] = 0x80;
  for (var i = n + 1; i < padded; i++) { bytes[i] = 0; }
  var bits = n * 8;
  bytes[padded - 4] = bits >>> 24; bytes[padded - 3] = bits >>> 16; bytes[padded - 2] = bits >>> 8; bytes[padded - 1] = bits;
  var h0 = 0x6a09e667, h1 = 0xbb67ae85 | 0, h2 = 0x3c6ef372, h3 = 0xa54ff53a | 0,
      h4 = 0x510e527f, h5 = 0x9b05688c | 0, h6 = 0x1f83d9ab, h7 = 0x5be0cd19;
  for (var off = 0; off < padded; off += 64) {
    for (var t = 0; t < 16; t++) {
      var j = off + t * 4;
      W[t] = (bytes[j] << 24) | (bytes[j + 1] << 16) | (bytes[j + 2] << 8) | bytes[j + 3];
    }
    for (t = 16; t < 64; t++) {
      var x = W[t - 15], y = W[t - 2];
      var s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
      var s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
      W[t] = (W[t - 16] + s0 + W[t - 7] + s1) | 0;
    }
    var a = h0, b = h1, c = h2, d = h3, e = h4, f = h5, g = h6, h = h7;
    for (t = 0; t < 64; t++) {
      var S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      var t1 = (h + S1 + ((e & f) ^ (~e & g)) + K[t] + W[t]) | 0;
      var S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      var t2 = (S0 + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    }
    h0 = (h0 + a) | 0; h1 = (h1 + b) | 0; h2 = (h2 + c) | 0; h3 = (h3 + d) | 0;
    h4 = (h4 + e) | 0; h5 = (h5 + f) | 0; h6 = (h6 + g) | 0; h7 = (h7 + h) | 0;
  }
  return h0 >>> 0;
}

self.onmessage = function (ev) {
  var challenge = ev.data.challenge, difficulty = ev.data.difficulty;
  var prefix = new TextEncoder().encode(challenge + ":");
  var bytes = new Uint8Array(prefix.length + 20 + 72);
  bytes.set(prefix);
  // A 32-bit word with difficulty zero bits on top is below this.
  var limit = difficulty >= 32 ? 1 : Math.pow(2, 32 - difficulty);
  var start = Date.now();
  for (var nonce = 0; ; nonce++) {
    var digits = String(nonce), n = prefix.length;
    for (var i = 0; i < digits.length; i++) { bytes[n++] = digits.charCodeAt(i); }
    var w = firstWord(bytes, n);
    if (w < limit) {
      postMessage({ nonce: digits, tries: nonce + 1, ms: Date.now() - start });
      return;
    }
  }
};
