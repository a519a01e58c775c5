-- Meridian GCRA, batched. Mirrors gcra.Decide / gcra.Reserve / gcra.DecideAll
-- (Go is the reference; conformance tests hold the two together).
--
-- Every number here is an integer below 2^53, so Lua doubles are exact.
-- Numbers reach Redis through redis.call, which formats them with %.17g:
-- integers below 2^53 never come out in exponent notation. Never use
-- tostring() or '..' on a number (they use %.14g).
--
-- ARGV[1]  now in µs for tests, or '' to use the server's TIME
-- ARGV[2]  number of ops
-- then per op:
--   kind   1 decide, 2 reserve, 3 composite
--   kind 2: maxWait (µs) first
--   kind 3: number of checks k first
--   then per check (one KEY each, in order):
--     cost, hasPrev (0|1), cur T, cur Burst, cur tag, cur effective,
--     and if hasPrev: prev T, prev Burst, prev tag, prev effective
--   (a zero limit is T = 0, Burst = 0)
-- Reply: per check six integers:
--   code (0 denied, 1 allowed, 2 too large, 3 this check's stored state is
--   malformed, 4 not decided because another check of the composite is
--   malformed; with 3 or 4 the op decides nothing and writes nothing),
--   remaining, retry-after µs
--   (-1 = never), reset-after µs, wait µs, version (0 current, 1 previous)

local TATMOD  = 137438953472     -- 2^37: stored TAT modulus
local TAGMOD  = 65536            -- 2^16: epoch tag modulus
local BEHIND  = 4294967296       -- 2^32: how far behind now a TAT may be read
local CONVCAP = 549755813888     -- 2^39: cap on conversions
local CHUNK   = 8192             -- 2^13

local floor = math.floor

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- floor(x*y/z) and the remainder, for 0 <= x <= 2^39, 0 < y, z <= 2^37,
-- by long division over 13-bit chunks of y: every intermediate stays
-- below 2^53. Results at or above CONVCAP return CONVCAP, 0.
local function divstep(q, r, x, c, z)
  local v = r * CHUNK + x * c
  local qi = floor(v / z)
  local ri = v - qi * z
  if ri < 0 then qi = qi - 1; ri = ri + z elseif ri >= z then qi = qi + 1; ri = ri - z end
  return q * CHUNK + qi, ri
end
local function muldiv(x, y, z)
  local c2 = floor(y / 67108864)
  local rest = y - c2 * 67108864
  local c1 = floor(rest / CHUNK)
  local c0 = rest - c1 * CHUNK
  local q, r = divstep(0, 0, x, c2, z)
  if q >= CONVCAP then return CONVCAP, 0 end
  q, r = divstep(q, r, x, c1, z)
  if q >= CONVCAP then return CONVCAP, 0 end
  q, r = divstep(q, r, x, c0, z)
  if q >= CONVCAP then return CONVCAP, 0 end
  return q, r
end

-- gcra.convert: the TAT under limit a keeping the tokens held at ta under p.
local function convert(tat, pT, pB, aT, aB, ta)
  if aT == 0 then return tat end
  local full = aB * aT
  if pT == 0 then return ta + full end
  local d = tat - ta
  if d < 0 then d = 0 end
  local credit = pB * pT - d
  if credit >= 0 then
    local c = muldiv(credit, aT, pT)
    if c >= full then return ta end
    return ta + full - c
  end
  local x = -credit
  if x > CONVCAP then x = CONVCAP end
  local q, r = muldiv(x, aT, pT)
  if r > 0 then q = q + 1 end
  if q > CONVCAP then q = CONVCAP end
  return ta + full + q
end

local function newer(a, b)
  local d = (a - b) % TAGMOD
  return d ~= 0 and d < 32768
end

local function emptyat(T, B, t)
  if T == 0 then return t end
  return t + B * T
end

-- gcra.tatUnder: the TAT the stored state stands for under version a.
local function tatunder(exists, tat, tag, aT, aB, aTag, aEff, hasP, pT, pB, pTag, pEff)
  if exists then
    if tag == aTag then return tat end
    if hasP and tag == pTag then return convert(tat, pT, pB, aT, aB, aEff) end
    if newer(tag, aTag) then return tat end
    if not hasP then return emptyat(aT, aB, aEff) end
    return convert(emptyat(pT, pB, pEff), pT, pB, aT, aB, aEff)
  end
  if not hasP then return now end
  return convert(aEff, pT, pB, aT, aB, aEff)
end

local function remaining(T, B, tat)
  local slack = B * T - (tat - now)
  if slack <= 0 then return 0 end
  local r = floor(slack / T)
  if r > B then r = B end
  return r
end

-- Decoded checks of the op being evaluated.
local ck = {}
local pos = 3      -- next ARGV
local kpos = 1     -- next KEY
local out = {}

-- read one check's arguments and stored state; resolve the version in force
local function load(i)
  local c = ck[i]
  if c == nil then c = {}; ck[i] = c end
  c.bad = false
  c.key = KEYS[kpos]; kpos = kpos + 1
  c.n = tonumber(ARGV[pos])
  local hasP = ARGV[pos + 1] == '1'
  local cT, cB = tonumber(ARGV[pos + 2]), tonumber(ARGV[pos + 3])
  local cTag, cEff = tonumber(ARGV[pos + 4]), tonumber(ARGV[pos + 5])
  pos = pos + 6
  local pT, pB, pTag, pEff = 0, 0, 0, 0
  if hasP then
    pT, pB = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1])
    pTag, pEff = tonumber(ARGV[pos + 2]), tonumber(ARGV[pos + 3])
    pos = pos + 4
  end
  -- pcall: a key of another type (WRONGTYPE) under our prefix fails this
  -- op alone, not the whole batch.
  local raw = redis.pcall('GET', c.key)
  local exists, tat, tag = false, 0, 0
  if type(raw) == 'table' then
    c.bad = true
    return
  end
  if raw then
    local v = nil
    if string.find(raw, '^%d+$') and #raw <= 16 then v = tonumber(raw) end
    if v == nil or v >= 9007199254740992 then
      c.bad = true
      return
    end
    exists = true
    tag = v % TAGMOD
    local low = (v - tag) / TAGMOD
    local base = now - BEHIND
    tat = base + (low - base) % TATMOD
  end
  c.exists, c.stag = exists, tag
  c.cT, c.cB, c.cEff = cT, cB, cEff
  if now >= cEff or not hasP then
    c.T, c.B, c.tag, c.ver = cT, cB, cTag, 0
    c.tat = tatunder(exists, tat, tag, cT, cB, cTag, cEff, hasP, pT, pB, pTag, pEff)
  else
    c.T, c.B, c.tag, c.ver = pT, pB, pTag, 1
    c.tat = tatunder(exists, tat, tag, pT, pB, pTag, pEff, false, 0, 0, 0, 0)
  end
end

-- GCRA step on a loaded check; maxWait < 0 means a plain decision.
-- Sets c.code, c.rem, c.retry, c.reset, c.wait, c.next.
local function step(c, n, maxWait)
  local T, B = c.T, c.B
  local base = c.tat
  if base < now then base = now end
  c.wait, c.next = 0, nil
  if T == 0 or n > B then
    c.code, c.retry = 2, -1
    if T == 0 then c.rem, c.reset = 0, 0
    else c.rem, c.reset = remaining(T, B, base), base - now end
    return
  end
  local nxt = base + n * T
  local early = nxt - B * T - now
  if maxWait >= 0 then
    if early < 0 then early = 0 end
    if early > maxWait then
      c.code, c.rem, c.retry, c.reset = 0, remaining(T, B, base), early, base - now
      return
    end
    c.code, c.rem, c.retry, c.reset, c.wait = 1, remaining(T, B, nxt), 0, nxt - now, early
  elseif early > 0 then
    c.code, c.rem, c.retry, c.reset = 0, remaining(T, B, base), early, base - now
    return
  else
    c.code, c.rem, c.retry, c.reset = 1, remaining(T, B, nxt), 0, nxt - now
  end
  if n > 0 then c.next = nxt end
end

local function write(c)
  if c.next == nil then return end
  local tag = c.tag
  if c.exists and newer(c.stag, tag) then tag = c.stag end
  local packed = (c.next % TATMOD) * TAGMOD + tag
  -- gcra.State.Rested: a change still pending takes over at its effective
  -- time, and the key must outlive its converted TAT too.
  local rested = c.next
  if c.ver == 1 and c.next > c.cEff then
    local conv = convert(c.next, c.T, c.B, c.cT, c.cB, c.cEff)
    if conv > rested then rested = conv end
  end
  redis.call('SET', c.key, packed, 'PX', math.ceil((rested - now) / 1000))
end

local function emitcode(code)
  local o = #out
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = code, 0, 0, 0, 0, 0
end

local function emitbad() emitcode(3) end

local function emit(c)
  local o = #out
  out[o + 1] = c.code
  out[o + 2] = c.rem
  out[o + 3] = c.retry
  out[o + 4] = c.reset
  out[o + 5] = c.wait
  out[o + 6] = c.ver
end

local nops = tonumber(ARGV[2])
for _ = 1, nops do
  local kind = ARGV[pos]
  pos = pos + 1
  if kind == '3' then
    local k = tonumber(ARGV[pos])
    pos = pos + 1
    local all, bad = true, false
    for i = 1, k do
      load(i)
      if ck[i].bad then bad = true end
    end
    if bad then
      for i = 1, k do
        if ck[i].bad then emitbad() else emitcode(4) end
      end
    else
      for i = 1, k do
        step(ck[i], ck[i].n, -1)
        if ck[i].code ~= 1 then all = false end
      end
      for i = 1, k do
        local c = ck[i]
        if all then
          write(c)
        elseif c.code == 1 then
          step(c, 0, -1)   -- would have admitted: report it untouched
          c.code = 0
        end
        emit(c)
      end
    end
  else
    local maxWait = -1
    if kind == '2' then
      maxWait = tonumber(ARGV[pos])
      pos = pos + 1
    end
    load(1)
    local c = ck[1]
    if c.bad then
      emitbad()
    else
      step(c, c.n, maxWait)
      write(c)
      emit(c)
    end
  end
end
return out
