// Per-call kernel switches read from the environment (FLASH_ATTN_SM90_FWD, _BWD,
// FLASH_ATTN_SM90_FWD_SHORT_STEPS): tests and A/B measurements force one kernel or the other, and
// since the variable is read on every call a process can flip it between calls.
#pragma once

#include <cstdlib>
#include <cstring>

namespace flash {

enum class EnvSwitch { kUnset, kOn, kOff };

// kOn where `variable` is exactly `on`, kOff where it is exactly `off`, else kUnset (the caller's
// default decides).
inline EnvSwitch read_env_switch(const char* variable, const char* on, const char* off) {
  const char* value = std::getenv(variable);
  if (value != nullptr && std::strcmp(value, on) == 0) return EnvSwitch::kOn;
  if (value != nullptr && std::strcmp(value, off) == 0) return EnvSwitch::kOff;
  return EnvSwitch::kUnset;
}

// The forced choice where the variable forces one, else `preferred()`.
template <typename Preferred>
bool env_switch_or(const char* variable, const char* on, const char* off, Preferred preferred) {
  const EnvSwitch forced = read_env_switch(variable, on, off);
  return forced == EnvSwitch::kUnset ? preferred() : forced == EnvSwitch::kOn;
}

}  // namespace flash
