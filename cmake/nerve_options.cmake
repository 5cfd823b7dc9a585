# Warnings and sanitizers for every target of ours, linked PRIVATE.
add_library(nerve_warnings INTERFACE)
add_library(nerve::warnings ALIAS nerve_warnings)
# -Wno-missing-field-initializers: leaving members of an options struct at their defaults in a
# designated initializer is the point of C++20 options structs, not a mistake.
target_compile_options(nerve_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-unused-parameter -Wno-missing-field-initializers>)

if(NERVE_SANITIZE STREQUAL "address")
  # -Wno-(maybe-)uninitialized: GCC 12 under ASan flags the `__m512 __Y = __Y;` idiom
  # inside its own avx512fintrin.h where Eigen transposes packets, and the payload of an
  # engaged std::optional (GCC bug 80635): false positives the instrumentation provokes;
  # the release build keeps both warnings for our code.
  set(_san -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
           -Wno-uninitialized -Wno-maybe-uninitialized)
elseif(NERVE_SANITIZE STREQUAL "thread")
  # -Wno-tsan: GCC warns at every inlining of a std::atomic_thread_fence, and Boost.Asio's
  # handlers use one (about a hundred warnings from headers we do not own); our own code
  # uses actors/detail full_fence(), which TSan models, and the runs are clean.
  set(_san -fsanitize=thread -fno-omit-frame-pointer -Wno-tsan)
elseif(NOT NERVE_SANITIZE STREQUAL "")
  message(FATAL_ERROR "NERVE_SANITIZE must be '', 'address' or 'thread'")
endif()
if(_san)
  # Applied globally so header-only code instantiated in every target is instrumented alike.
  foreach(_flag IN LISTS _san)
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:${_flag}>)
  endforeach()
  add_link_options(${_san})
endif()

# nerve_add_test(NAME name SOURCES ... LIBS ... [LABELS ...] [GPU])
# One doctest binary per folder; registered with CTest. GPU tests exit 77
# when no device can be opened and CTest reports them as skipped.
function(nerve_add_test)
  cmake_parse_arguments(T "GPU" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} doctest::doctest nerve::warnings)
  target_compile_definitions(${T_NAME} PRIVATE NERVE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
  if(T_GPU)
    set_tests_properties(${T_NAME} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endfunction()
