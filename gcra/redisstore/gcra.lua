-- Meridian GCRA, batched. Mirrors gcra.Decide / gcra.Reserve / gcra.DecideAll
-- (Go is the reference; conformance tests hold the two together).
--
-- Every number here is an integer below 2^53, so Lua doubles are exact:
-- instants are below gcra.MaxTAT (2^52 + 2^51), windows at most 2^51, and
-- the conversions' products are split into 26-bit limbs (muldiv). Numbers
-- reach Redis through redis.call, which formats them with %.17g: integers
-- below 2^53 never come out in exponent notation. Never use tostring() or
-- '..' on a number (they use %.14g).
--
-- ARGV[1]  now in µs for tests, or '' to use the server's TIME
-- ARGV[2]  the batch: a sequence of big-endian signed 64-bit integers
--   (8 bytes each, read with struct.unpack '>i8'):
--   number of ops, number of distinct schedules L, then L schedules:
--     cur T, cur Burst, cur tag, cur effective, flags (1 hasPrev +
--     2 fenced), and if hasPrev: prev T, prev Burst, prev tag, prev
--     effective, and if fenced: the fence's term and epoch
--   (tags are gcra.EpochTag's 40 bits), then per op one word
--   w = (index·4 + kind)·2^40 + cost, where kind is
--   1 decide and 2 reserve (one check: the schedule index, 1-based, and the
--   cost, capped at 2^39 — any cost above Burst is too large anyway), each
--   with one KEY; a reservation's word is followed by maxWait (µs);
--   3 composite: cost holds the number of checks k, and k words follow,
--   one per check (kind 0), each with one KEY, in order.
--   (a zero limit is T = 0, Burst = 0)
-- ARGV[3]  the format to write: '' the exact Value (gcra.EncodeValue: 7
--   bytes of TAT, 5 of tag, 7 of the writer's T and 5 of its burst,
--   big-endian), '2' the previous release's 12-byte value (TAT and tag:
--   gcra.EncodeValueV2), '1' the packed integer of older releases
--   (gcra.PackV1); the last two for a rolling upgrade. All are always read.
-- ARGV[4]  '1' when the last KEY is the region fence (gcra.Fence: 16 bytes,
--   term and epoch big-endian); a fenced check whose fence is below it, or
--   any fenced check while it is missing, is refused with code 5.
-- Reply: one bulk string of big-endian signed 64-bit integers (struct.pack
-- '>i8'), per check: code + 8·version, remaining, retry-after µs (-1 =
-- never), reset-after µs, and for a reservation also wait µs.
--   code: 0 denied, 1 allowed, 2 too large, 3 this check's stored state is
--   malformed, 4 not decided because another check of the composite is
--   malformed or fenced, 5 fenced (with 3, 4 or 5 the op decides and
--   writes nothing).
--   version: 0 the current limit decided, 1 the previous one.
-- A batch whose length is not a multiple of 8 is refused before anything
-- is read or written; one that ends early fails in struct.unpack ("data
-- string too short").

local MAXTAT  = 6755399441055743 -- gcra.MaxTAT: 2^52 + 2^51 - 1
local TAGMOD  = 1099511627776    -- 2^40: epoch tag modulus
local HALFTAG = 549755813888     -- 2^39
local L26     = 67108864         -- 2^26: limb of muldiv
local P52     = 4503599627370496 -- 2^52
-- The packed format of older releases (gcra.PackV1).
local V1TAT   = 137438953472     -- 2^37: its TAT modulus
local V1TAG   = 65536            -- 2^16: its tag modulus
local V1BEHIND = 4294967296      -- 2^32: gcra.V1ReadBehind
local V1SLACK = 60000000         -- gcra.V1ExpirySlack, µs
local MAXWIN  = 2251799813685248 -- gcra.MaxWindowMicros: 2^51
local MAXBURST = 549755813887    -- gcra.MaxBurst: 2^39 - 1

local floor = math.floor

local P = ARGV[2]
if type(P) ~= 'string' or #P % 8 ~= 0 then
  return redis.error_reply('meridian gcra: ARGV[2] must be whole 8-byte integers')
end
local off = 1      -- next byte of P

-- int reads the next integer of the batch.
local function int()
  local v
  v, off = struct.unpack('>i8', P, off)
  return v
end

local now
local V1 = ARGV[3] == '1'
local V2 = ARGV[3] == '2'

if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- muldiv is gcra.mulDiv: floor(x*y/z) and whether a remainder is left, the
-- quotient saturating at MAXTAT, for 0 <= x <= MAXTAT and 0 < y, z <= 2^51.
-- A double estimate of the quotient (off by at most 3) is corrected with
-- the exact remainder x*y - q*z, computed in 26-bit limbs: every partial
-- product and sum is an integer below 2^53, and so is the remainder.
local function muldiv(x, y, z)
  local q = floor(x * y / z)
  if q >= MAXTAT + 8 then return MAXTAT, false end
  local x1 = floor(x / L26); local x0 = x - x1 * L26
  local y1 = floor(y / L26); local y0 = y - y1 * L26
  local q1 = floor(q / L26); local q0 = q - q1 * L26
  local z1 = floor(z / L26); local z0 = z - z1 * L26
  local c = x0 * y0 - q0 * z0
  local ch = floor(c / L26); c = c - ch * L26
  local b1 = x1 * y0 - q1 * z0
  local b1h = floor(b1 / L26); b1 = b1 - b1h * L26
  local b2 = x0 * y1 - q0 * z1
  local b2h = floor(b2 / L26); b2 = b2 - b2h * L26
  local m = b1 + b2 + ch
  local mh = floor(m / L26); m = m - mh * L26
  local d = (x1 * y1 - q1 * z1 + b1h + b2h + mh) * P52 + (m * L26 + c)
  while d < 0 do q = q - 1; d = d + z end
  while d >= z do q = q + 1; d = d - z end
  if q >= MAXTAT then return MAXTAT, false end
  return q, d > 0
end

-- gcra.convert: the TAT under limit a keeping the tokens held at ta under p.
local function convert(tat, pT, pB, aT, aB, ta)
  if aT == 0 then return tat end
  local full = aB * aT
  if pT == 0 then
    -- p held nothing; slots booked past ta keep their times.
    local b = tat - ta
    if b < 0 then b = 0 end
    if b >= MAXTAT - ta - full then return MAXTAT end
    return ta + full + b
  end
  local d = tat - ta
  if d < 0 then d = 0 end
  local credit = pB * pT - d
  if credit >= 0 then
    local c = muldiv(credit, aT, pT)
    if c >= full then return ta end
    return ta + full - c
  end
  local x = -credit
  if x > MAXTAT then x = MAXTAT end
  local q, rem = muldiv(x, aT, pT)
  if rem and q < MAXTAT then q = q + 1 end
  -- Booked slots keep their times: the debt is never shorter than it was.
  if q < x then q = x end
  if q >= MAXTAT - ta - full then return MAXTAT end
  return ta + full + q
end

local function newer(a, b)
  local d = (a - b) % TAGMOD
  return d ~= 0 and d < HALFTAG
end

local function emptyat(T, B, t)
  if T == 0 then return t end
  return t + B * T
end

-- gcra.filledFrom: a key with no state under a version is empty at its
-- change (full from the start for one in force since time 0).
local function filledfrom(T, B, eff)
  if eff <= 0 then return 0 end
  return emptyat(T, B, eff)
end

-- gcra.State.under: the state's TAT counts tokens in limit (T, B): its
-- writer's limit (wT, wB) is that one, or unknown (0: an older release's).
local function under(wT, wB, T, B)
  return wT == 0 or (wT == T and wB == B)
end

-- gcra.fromWriter: a TAT written under (wT, wB) as one under (T, B), in
-- force since ta: converted at max(ta, min(now, tat)).
local function fromwriter(tat, wT, wB, T, B, ta)
  local c = tat
  if c > now then c = now end
  if c < ta then c = ta end
  return convert(tat, wT, wB, T, B, c)
end

-- gcra.tatUnder: the TAT the stored state stands for under version a.
local function tatunder(exists, tat, tag, wT, wB, aT, aB, aTag, aEff, hasP, pT, pB, pTag, pEff)
  if exists then
    if tag == aTag or newer(tag, aTag) then
      if under(wT, wB, aT, aB) then return tat end
      return fromwriter(tat, wT, wB, aT, aB, aEff)
    end
    if hasP and tag == pTag then
      if under(wT, wB, pT, pB) then return convert(tat, pT, pB, aT, aB, aEff) end
      return fromwriter(tat, wT, wB, aT, aB, aEff)
    end
    -- Older than the previous change: empty at that change, or its own
    -- TAT if later (slots it booked keep their times), the latter from
    -- its writer's unit.
    if not hasP then
      if under(wT, wB, aT, aB) then return math.max(emptyat(aT, aB, aEff), tat) end
      return math.max(emptyat(aT, aB, aEff), fromwriter(tat, wT, wB, aT, aB, aEff))
    end
    if under(wT, wB, pT, pB) then
      return convert(math.max(emptyat(pT, pB, pEff), tat), pT, pB, aT, aB, aEff)
    end
    return math.max(convert(emptyat(pT, pB, pEff), pT, pB, aT, aB, aEff), fromwriter(tat, wT, wB, aT, aB, aEff))
  end
  if not hasP then return now end
  -- No state: as a state older than p (empty at p's change).
  local f = filledfrom(pT, pB, pEff)
  if f < aEff then f = aEff end
  return convert(f, pT, pB, aT, aB, aEff)
end

local function remaining(T, B, tat)
  local slack = B * T - (tat - now)
  if slack <= 0 then return 0 end
  local r = floor(slack / T)
  if r > B then r = B end
  return r
end

local kpos = 1     -- next KEY
local out = {}
local no = 0       -- values in out

local nops = int()

-- The batch's distinct schedules, parsed once into one flat table, eleven
-- fields each: cur T, B, tag, effective, hasPrev, prev T, B, tag,
-- effective, fence term, fence epoch (nil: unfenced).
local S = {}
for i = 0, int() - 1 do
  local b = i * 11
  local flags
  S[b + 1], S[b + 2], S[b + 3], S[b + 4], flags, off = struct.unpack('>i8i8i8i8i8', P, off)
  local hasP = flags % 2 == 1
  S[b + 5] = hasP
  if hasP then
    S[b + 6], S[b + 7], S[b + 8], S[b + 9], off = struct.unpack('>i8i8i8i8', P, off)
  end
  if flags >= 2 then
    S[b + 10], S[b + 11], off = struct.unpack('>i8i8', P, off)
  end
end

-- The region fence (gcra.Fence), read once, on the first fenced check:
-- KEYS[#KEYS] when ARGV[4] is '1'. FT is false when none is held (or the
-- key holds something else): then no fenced check is decided.
local FT, FE
local function fenceok(t, e)
  if FT == nil then
    FT = false
    if ARGV[4] == '1' then
      local ok, v = pcall(redis.call, 'GET', KEYS[#KEYS])
      if ok and type(v) == 'string' and #v == 16 then
        FT, FE = struct.unpack('>i8i8', v)
      end
    end
  end
  return FT and (t > FT or (t == FT and e >= FE))
end

-- readstate reads a key's state: ok, exists, tat, tag, writer's T and
-- burst (0, 0: unknown). A key of another type (pcall: WRONGTYPE fails this
-- op alone, not the batch) or a value the script did not write is not ok.
--
-- A Value (24 bytes, the first below 0x20) holds the exact TAT and tag and
-- the limit it was written under; the previous release's (12 bytes) the
-- TAT and tag.
-- A packed integer of an older release (gcra.UnpackV1) holds the TAT
-- modulo 2^37: it is read as the latest such instant not after the key's
-- expiry (its Rested, never before its TAT) plus V1SLACK, and its 16-bit
-- tag is widened to the one nearest the schedule's current tag. A packed
-- key without an expiry is read as the older release read it (relative to
-- gcra.ReadRefV1).
local function readstate(key, cTag, hasP, pTag, cEff)
  local raw = redis.pcall('GET', key)
  if not raw then return true, false, 0, 0, 0, 0 end
  if type(raw) == 'table' then return false, false, 0, 0, 0, 0 end
  if #raw == 24 and string.byte(raw, 1) < 32 then
    local tat, tag, wT, wB = struct.unpack('>I7I5I7I5', raw)
    if tat > MAXTAT then return false, false, 0, 0, 0, 0 end
    if wT ~= 0 or wB ~= 0 then
      -- gcra.FromInterval's usable: T >= 1, 1 <= B <= MaxBurst, B*T within
      -- MaxWindow (checked as T <= floor(2^51 / B), exactly).
      if wT < 1 or wT > MAXWIN or wB < 1 or wB > MAXBURST then return false, false, 0, 0, 0, 0 end
      local q = floor(MAXWIN / wB)
      while q * wB > MAXWIN do q = q - 1 end
      while (q + 1) * wB <= MAXWIN do q = q + 1 end
      if wT > q then return false, false, 0, 0, 0, 0 end
    end
    return true, true, tat, tag, wT, wB
  end
  if #raw == 12 and string.byte(raw, 1) < 32 then
    local tat, tag = struct.unpack('>I7I5', raw)
    if tat > MAXTAT then return false, false, 0, 0, 0, 0 end
    return true, true, tat, tag, 0, 0
  end
  if #raw > 16 or not string.find(raw, '^%d+$') then
    return false, false, 0, 0, 0, 0
  end
  local v = tonumber(raw)
  if v >= 9007199254740992 then return false, false, 0, 0, 0, 0 end
  local t16 = v % V1TAG
  local low = (v - t16) / V1TAG
  local upper
  local pttl = redis.call('PTTL', key)
  if pttl >= 0 then
    upper = now + pttl * 1000 + V1SLACK
  else
    local ref = now
    if hasP and t16 == pTag % V1TAG and cEff < now then ref = cEff end
    upper = ref - V1BEHIND + V1TAT - 1
  end
  local tag = (cTag + ((t16 - cTag) % V1TAG + 32768) % V1TAG - 32768) % TAGMOD
  return true, true, upper - (upper - low) % V1TAT, tag, 0, 0
end

-- asis reports whether a state read under the version (T, B, tag) is used
-- as stored: written under it (or a newer tag) in its unit (gcra.rebase).
local function asis(exists, stag, wT, wB, T, B, tag)
  return exists and under(wT, wB, T, B) and (stag == tag or newer(stag, tag))
end

-- loadcheck reads one check's arguments and state and resolves the version
-- in force: ok, key, n, T, B, tag, ver, tat, exists, stored tag, the
-- current limit (for a change still pending), the version's effective
-- time, and whether a denial re-stores the state (gcra.Rebase: it was read
-- through a conversion and is still refilling).
local W = 1099511627776 -- 2^40

-- word splits an op word into kind, schedule index and cost.
local function word(w)
  local hi = floor(w / W)
  local kind = hi % 4
  return kind, (hi - kind) / 4, w - hi * W
end

local function loadcheck(i, n)
  local key = KEYS[kpos]
  kpos = kpos + 1
  local b = (i - 1) * 11
  if S[b + 10] and not fenceok(S[b + 10], S[b + 11]) then return false, 5 end
  local cT, cB, cTag, cEff = S[b + 1], S[b + 2], S[b + 3], S[b + 4]
  local ok, exists, tat, stag, wT, wB = readstate(key, cTag, S[b + 5], S[b + 8], cEff)
  if not ok then return false end
  if not S[b + 5] then
    if not (exists and stag == cTag and under(wT, wB, cT, cB)) then
      tat = tatunder(exists, tat, stag, wT, wB, cT, cB, cTag, cEff, false, 0, 0, 0, 0)
    end
    return true, key, n, cT, cB, cTag, 0, tat, exists, stag, cT, cB, cEff, cEff,
      exists and tat > now and not asis(exists, stag, wT, wB, cT, cB, cTag)
  end
  local pT, pB, pTag, pEff = S[b + 6], S[b + 7], S[b + 8], S[b + 9]
  if now >= cEff then
    tat = tatunder(exists, tat, stag, wT, wB, cT, cB, cTag, cEff, true, pT, pB, pTag, pEff)
    return true, key, n, cT, cB, cTag, 0, tat, exists, stag, cT, cB, cEff, cEff,
      exists and tat > now and not asis(exists, stag, wT, wB, cT, cB, cTag)
  end
  if exists then
    tat = tatunder(exists, tat, stag, wT, wB, pT, pB, pTag, pEff, false, 0, 0, 0, 0)
    return true, key, n, pT, pB, pTag, 1, tat, exists, stag, cT, cB, cEff, pEff,
      tat > now and not asis(exists, stag, wT, wB, pT, pB, pTag)
  else
    -- No state under a version that replaced another: empty at its change.
    tat = filledfrom(pT, pB, pEff)
    if tat < now then tat = now end
  end
  return true, key, n, pT, pB, pTag, 1, tat, exists, stag, cT, cB, cEff, pEff
end

-- step is GCRA on one resolved check; maxWait < 0 means a plain decision.
-- Returns code, remaining, retry, reset, wait, and the TAT to write (or
-- false).
local function step(T, B, tat, n, maxWait)
  local base = tat
  if base < now then base = now end
  if T == 0 then return 2, 0, -1, 0, 0, false end
  if n > B then return 2, remaining(T, B, base), -1, base - now, 0, false end
  local nxt = base + n * T
  local early = nxt - B * T - now
  if maxWait >= 0 then
    if early < 0 then early = 0 end
    if early > maxWait then return 0, remaining(T, B, base), early, base - now, 0, false end
  elseif early > 0 then
    return 0, remaining(T, B, base), early, base - now, 0, false
  end
  if n == 0 then return 1, remaining(T, B, nxt), 0, nxt - now, early > 0 and early or 0, false end
  return 1, remaining(T, B, nxt), 0, nxt - now, early > 0 and early or 0, nxt
end

-- write stores a TAT written under version ver, with its limit (T, B) (see
-- gcra.Schedule.written).
local function write(key, nxt, T, B, tag, ver, exists, stag, cT, cB, cEff, vEff)
  -- gcra.Schedule.written: a state outlives one window of its version, and
  -- one still refilling when a pending change takes over its converted TAT.
  local rested = nxt
  if exists and newer(stag, tag) then
    tag = stag
  else
    local e = filledfrom(T, B, vEff)
    if e > rested then rested = e end
  end
  if ver == 1 and rested > cEff then
    local conv = convert(rested, T, B, cT, cB, cEff)
    if conv > rested then rested = conv end
  end
  local val
  if V1 then
    val = (nxt % V1TAT) * V1TAG + tag % V1TAG
  elseif V2 then
    val = struct.pack('>I7I5', nxt, tag)
  else
    val = struct.pack('>I7I5I7I5', nxt, tag, T, B)
  end
  redis.call('SET', key, val, 'PX', math.ceil((rested - now) / 1000))
end

local function emit(a, b, c, d)
  out[no + 1], out[no + 2], out[no + 3], out[no + 4] = a, b, c, d
  no = no + 4
end

for _ = 1, nops do
  local kind, idx, n = word(int())
  if kind ~= 3 then
    local maxWait = -1
    if kind == 2 then
      maxWait = int()
    end
    local ok, key, n, T, B, tag, ver, tat, exists, stag, cT, cB, cEff, vEff, rebase = loadcheck(idx, n)
    if not ok then
      emit(key or 3, 0, 0, 0)
      if maxWait >= 0 then no = no + 1; out[no] = 0 end
    else
      local code, rem, retry, reset, wait, nxt = step(T, B, tat, n, maxWait)
      if nxt then
        write(key, nxt, T, B, tag, ver, exists, stag, cT, cB, cEff, vEff)
      elseif code == 0 and n > 0 and rebase and T ~= 0 and tat - now <= B * T then
        -- gcra.Rebase: denied, the converted state is re-stored as it is.
        write(key, tat, T, B, tag, ver, exists, stag, cT, cB, cEff, vEff)
      end
      emit(code + 8 * ver, rem, retry, reset)
      if maxWait >= 0 then no = no + 1; out[no] = wait end
    end
  else
    local k = n
    local cks, bad = {}, false
    for i = 1, k do
      local _, ci, cn = word(int())
      local c = {loadcheck(ci, cn)}
      cks[i] = c
      if not c[1] then bad = true end
    end
    if bad then
      for i = 1, k do
        if cks[i][1] then emit(4, 0, 0, 0) else emit(cks[i][2] or 3, 0, 0, 0) end
      end
    else
      local all = true
      local res = {}
      for i = 1, k do
        local c = cks[i]
        local r = {step(c[4], c[5], c[8], c[3], -1)}
        res[i] = r
        if r[1] ~= 1 then all = false end
      end
      for i = 1, k do
        local c, r = cks[i], res[i]
        if all then
          if r[6] then write(c[2], r[6], c[4], c[5], c[6], c[7], c[9], c[10], c[11], c[12], c[13], c[14]) end
        else
          if c[3] > 0 and r[1] ~= 2 and c[15] and c[4] ~= 0 and c[8] - now <= c[5] * c[4] then
            -- gcra.DecideAll: nothing consumed, a converted state re-stored.
            write(c[2], c[8], c[4], c[5], c[6], c[7], c[9], c[10], c[11], c[12], c[13], c[14])
          end
          if r[1] == 1 then
            r = {step(c[4], c[5], c[8], 0, -1)} -- would have admitted: report it untouched
            r[1] = 0
          end
        end
        emit(r[1] + 8 * c[7], r[2], r[3], r[4])
      end
    end
  end
end

-- Pack the reply, at most 128 integers per struct.pack call (its arguments
-- go on the C stack).
local F128 = '>' .. string.rep('i8', 128)
local parts = {}
for i = 1, no, 128 do
  local j, f = i + 127, F128
  if j > no then
    j = no
    f = '>' .. string.rep('i8', j - i + 1)
  end
  parts[#parts + 1] = struct.pack(f, unpack(out, i, j))
end
return table.concat(parts)
