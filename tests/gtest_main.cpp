// The test executables' main: GoogleTest's, except that a run whose every selected case skipped
// exits 77, which CTest reports as skipped (SKIP_RETURN_CODE, tests/cmake/test_groups.cmake). A
// run where any case failed exits 1 as before; one where some ran and passed exits 0.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int status = RUN_ALL_TESTS();
  const ::testing::UnitTest& run = *::testing::UnitTest::GetInstance();
  if (status == 0 && run.test_to_run_count() > 0 &&
      run.skipped_test_count() == run.test_to_run_count()) {
    return 77;
  }
  return status;
}
