# Read by CTest (TEST_INCLUDE_FILES) before it runs: one CTest test per GoogleTest suite of the test
# binary, `<binary> --gtest_filter=<Suite>.*`, so the ~500 tests start ~100 processes instead of one
# each (a process that loads LibTorch costs about a second). Inputs: TEST_BINARY, TEST_TIMEOUT,
# TEST_COSTS (a file of "<suite> <seconds>" lines: CTest starts the costliest suites first).
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
string(REPLACE "\n" ";" lines "${listing}")
foreach(line IN LISTS lines)
  # suite lines start in column 0 and end with '.', optionally followed by "  # TypeParam = ..."
  if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
    add_test("${suite}" "${TEST_BINARY}" "--gtest_filter=${suite}.*")
    set(cost 1)
    foreach(entry IN LISTS costs)
      if(entry MATCHES "^([^ ]+) +([0-9.]+)$" AND CMAKE_MATCH_1 STREQUAL suite)
        set(cost "${CMAKE_MATCH_2}")
      endif()
    endforeach()
    # a suite whose every test skipped (GPU tests on a CPU machine) is reported skipped; a suite with
    # a failure never matches (its FAILED list follows the SKIPPED one)
    set_tests_properties("${suite}" PROPERTIES TIMEOUT "${TEST_TIMEOUT}" COST "${cost}"
                         SKIP_REGULAR_EXPRESSION "\\[  PASSED  \\] 0 tests\\.\n\\[  SKIPPED \\] [0-9]+ tests?, listed below:\n(\\[  SKIPPED \\] [^\n]*\n?)+$")
  endif()
endforeach()
