// gmi_drl.envs._cpp_examples: the C++ env template's example env and its contract checks, one
// submodule each (`gmi_drl.envs.register_cpp(task_id, "gmi_drl.envs._cpp_examples:pendulum")`).

#include "faults.h"
#include "pendulum.h"

PYBIND11_MODULE(_cpp_examples, m) {
  m.doc() = "Envs written against csrc/env_template.h (see docs/add-a-cpp-env.md)";
  auto pendulum = m.def_submodule("pendulum");
  gmi_drl::bind_env<gmi_drl_examples::Pendulum>(pendulum, "Pendulum-v1 on the C++ env template");
  const char* faulty = "an env that breaks the template's contract (tests only)";
  auto obs_too_long = m.def_submodule("obs_too_long");
  gmi_drl::bind_env<gmi_drl_examples::Faulty<0>>(obs_too_long, faulty);
  auto obs_too_short = m.def_submodule("obs_too_short");
  gmi_drl::bind_env<gmi_drl_examples::Faulty<1>>(obs_too_short, faulty);
  auto action_too_wide = m.def_submodule("action_too_wide");
  gmi_drl::bind_env<gmi_drl_examples::Faulty<2>>(action_too_wide, faulty);
  auto reset_too_short = m.def_submodule("reset_too_short");
  gmi_drl::bind_env<gmi_drl_examples::Faulty<3>>(reset_too_short, faulty);
  auto bad_spec = m.def_submodule("bad_spec");
  gmi_drl::bind_env<gmi_drl_examples::Faulty<4>>(bad_spec, faulty);
}
