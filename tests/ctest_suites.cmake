# Read by CTest (TEST_INCLUDE_FILES) before it runs: one CTest test per GoogleTest suite of the test
# binary, `<binary> --gtest_filter=<Suite>.*`, so the ~500 tests start ~100 processes instead of one
# each (a process that loads LibTorch costs about a second). A suite that costs more than
# TEST_SPLIT_COST seconds runs one process per test instead, so that no single process holds up a
# parallel run. Inputs: TEST_BINARY, TEST_TIMEOUT, TEST_COSTS (a file of "<suite> <seconds>" lines:
# CTest starts the costliest first), TEST_SPLIT_COST. Every process runs on one intra-op thread
# (OMP_NUM_THREADS=1): CTest runs as many processes as there are cores, and OpenMP's spinning
# threads oversubscribed that way make the thousands of tiny FP64 ops of a conformance test run
# tens of times slower.
if(NOT EXISTS "${TEST_BINARY}")
  add_test(mixbench_tests.NOT_BUILT "${TEST_BINARY}")
  return()
endif()
execute_process(COMMAND "${TEST_BINARY}" --gtest_list_tests
                OUTPUT_VARIABLE listing RESULT_VARIABLE rc TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${TEST_BINARY} --gtest_list_tests failed (${rc}): ${listing}")
endif()
set(costs "")
if(EXISTS "${TEST_COSTS}")
  file(STRINGS "${TEST_COSTS}" costs REGEX "^[^#]")
endif()
# a suite whose every test skipped (GPU tests on a CPU machine) is reported skipped; a run with a
# failure never matches (its FAILED list follows the SKIPPED one)
set(skipped_re "\\[  PASSED  \\] 0 tests\\.\n\\[  SKIPPED \\] [0-9]+ tests?, listed below:\n(\\[  SKIPPED \\] [^\n]*\n?)+$")

# suites in listing order, each with its tests
set(suites "")
string(REPLACE "\n" ";" lines "${listing}")
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")  # "Suite." or "Prefix/Suite.  # TypeParam = ..."
    set(suite "${CMAKE_MATCH_1}")
    list(APPEND suites "${suite}")
    set(tests_${suite} "")
  elseif(line MATCHES "^  ([^ ]+)" AND DEFINED suite)  # "  Test" or "  Test/param  # GetParam() = ..."
    list(APPEND tests_${suite} "${CMAKE_MATCH_1}")
  endif()
endforeach()

foreach(suite IN LISTS suites)
  set(cost 1)
  foreach(entry IN LISTS costs)
    if(entry MATCHES "^([^ ]+) +([0-9.]+)$" AND CMAKE_MATCH_1 STREQUAL suite)
      set(cost "${CMAKE_MATCH_2}")
    endif()
  endforeach()
  if(cost GREATER TEST_SPLIT_COST)
    list(LENGTH tests_${suite} n)
    math(EXPR each "(${cost} + ${n} - 1) / ${n}")
    foreach(test IN LISTS tests_${suite})
      add_test("${suite}.${test}" "${TEST_BINARY}" "--gtest_filter=${suite}.${test}")
      set_tests_properties("${suite}.${test}" PROPERTIES TIMEOUT "${TEST_TIMEOUT}" COST "${each}"
                           ENVIRONMENT OMP_NUM_THREADS=1 SKIP_REGULAR_EXPRESSION "${skipped_re}")
    endforeach()
  else()
    add_test("${suite}" "${TEST_BINARY}" "--gtest_filter=${suite}.*")
    set_tests_properties("${suite}" PROPERTIES TIMEOUT "${TEST_TIMEOUT}" COST "${cost}"
                         ENVIRONMENT OMP_NUM_THREADS=1 SKIP_REGULAR_EXPRESSION "${skipped_re}")
  endif()
endforeach()
