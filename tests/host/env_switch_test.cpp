// Host check of csrc/flash/env_switch.h (built by tests/test_host_headers.py with g++): each setting
// of the variable (unset, the "on" value, the "off" value, other values, a prefix of either) against
// the choice it must give, with the default both ways.
#include <cstdio>
#include <cstdlib>
#include <initializer_list>

#include "flash/env_switch.h"

int main() {
  const char* kVariable = "FLASH_ATTN_ENV_SWITCH_TEST";
  struct Case {
    const char* value;  // nullptr: unset
    int forced;         // 1 on, 0 off, -1 the default
  };
  const Case cases[] = {{nullptr, -1}, {"ws", 1}, {"cpasync", 0}, {"", -1}, {"w", -1}, {"wss", -1},
                        {"WS", -1}, {"cpasync ", -1}};
  long checked = 0, failures = 0;
  for (const Case& c : cases) {
    if (c.value == nullptr) unsetenv(kVariable);
    else setenv(kVariable, c.value, 1);
    for (const bool preferred : {false, true}) {
      const bool expected = c.forced < 0 ? preferred : c.forced == 1;
      const bool got = flash::env_switch_or(kVariable, "ws", "cpasync", [&] { return preferred; });
      ++checked;
      if (got != expected) {
        ++failures;
        std::printf("value %s preferred %d: got %d\n", c.value ? c.value : "(unset)", preferred, got);
      }
    }
  }
  std::printf("%ld checked, %ld wrong\n", checked, failures);
  return failures == 0 ? 0 : 1;
}
