# Options every ferry target shares: warnings, the Asio 1.18 include fix, sanitizers.
add_library(ferry_options INTERFACE)
target_compile_options(ferry_options INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-missing-field-initializers
  # Asio 1.18 (Boost 1.74) uses std::exchange without including <utility> under C++20/23.
  -include utility)

if(FERRY_SANITIZE)
  string(REPLACE ";" "," ferry_sanitizers "${FERRY_SANITIZE}")
  target_compile_options(ferry_options INTERFACE -fsanitize=${ferry_sanitizers} -fno-omit-frame-pointer
    -fno-sanitize-recover=all)
  target_link_options(ferry_options INTERFACE -fsanitize=${ferry_sanitizers})
endif()
