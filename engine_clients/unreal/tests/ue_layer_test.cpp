// ue_layer_test.cpp - runs the Unreal layer (Public/, Private/) against ue_stubs/ and the real
// bridge: the subsystem finds the shipped bridge in the plugin folder ($OAM_STUB_PLUGIN_DIR, no
// OAM_BRIDGE_CMD), a UOamNpcComponent creates its NPC from USTRUCT config, answers a tool call
// through its own delegate, the async nodes respond and decide, Prewarm (component and subsystem)
// reports its speaker and prefix in OnTurnStarted, SaveTranscript / RestoreTranscript
// answer asynchronously and report failures (unknown NPC, a bridge that died) instead of an empty save.
// The stub "game loop" is UEStub_PumpGameThread().
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "Async/Async.h"
#include "OamAsyncActions.h"
#include "OamBridgeSubsystem.h"
#include "OamNpcComponent.h"

static int Failures = 0;
static void Check(bool Cond, const std::string& What)
{
	std::cout << (Cond ? "ok   - " : "FAIL - ") << What << std::endl;
	Failures += Cond ? 0 : 1;
}

// the condition first (it pumps the game loop), then the message, which may show the result
#define CHECK(Cond, What) do { const bool CheckOk_ = (Cond); Check(CheckOk_, What); } while (0)

template <class F> static bool PumpUntil(F Done, double Seconds = 20)
{
	const auto Deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(Seconds * 1000));
	while (!Done())
	{
		if (UEStub_PumpGameThread() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
		if (std::chrono::steady_clock::now() > Deadline) return false;
	}
	return true;
}

// A Blueprint-like listener: UFUNCTION handlers bound with AddDynamic / BindDynamic.
class UListener : public UObject
{
public:
	UOamNpcComponent* Npc = nullptr;
	int Created = 0, Deltas = 0, Completed = 0, Failed = 0;
	FString Text, ToolArgs, FailCode;
	bool bSaveDone = false, bSaveOk = false;
	FString SaveJson;
	FOamError SaveError;
	FOamTurnResult NodeResult;
	bool bNodeDone = false, bNodeOk = false;
	int NodeDeltas = 0;
	FOamDecision Decision;
	TArray<FString> Started;  // "Kind|Speaker|Prompt" of each OnTurnStarted
	FString FinishReason;

	void HandleStarted(const FString&, const FString&, const FString& Kind, const FString& Speaker, const FString& Prompt)
	{
		Started.Add(Kind + TEXT("|") + Speaker + TEXT("|") + Prompt);
	}
	void HandleCreated(bool bOk, const FOamError&) { Created += bOk ? 1 : 0; }
	void HandleDelta(const FString&, const FString&, bool) { ++Deltas; }
	void HandleToolCall(const FOamToolCall& Call)
	{
		ToolArgs = Call.ArgumentsJson;
		Npc->SubmitToolOutput(Call.CallId, TEXT("{\"opened\":\"north\"}"));
	}
	void HandleCompleted(const FOamTurnResult& R) { ++Completed; Text = R.Text; FinishReason = R.FinishReason; }
	void HandleFailed(const FString&, const FOamError& E) { ++Failed; FailCode = E.Code; }
	void HandleSaved(bool bOk, const FString& Json, const FOamError& E) { bSaveDone = true; bSaveOk = bOk; SaveJson = Json; SaveError = E; }
	void HandleNodeDelta(const FOamTurnResult&, const FOamError&) { ++NodeDeltas; }
	void HandleNodeDone(const FOamTurnResult& R, const FOamError& E) { bNodeDone = true; bNodeOk = E.Code.IsEmpty(); NodeResult = R; }
	void HandleDecided(const FOamDecision& D, const FOamTurnResult&, const FOamError& E) { bNodeDone = true; bNodeOk = E.Code.IsEmpty(); Decision = D; }
};

int main()
{
	// The game instance, its subsystem, a world and an actor with the component.
	UGameInstance* GameInstance = NewObject<UGameInstance>();
	UOamBridgeSubsystem* Bridge = NewObject<UOamBridgeSubsystem>();
	GameInstance->UEStub_Add(Bridge);
	UWorld* World = NewObject<UWorld>();
	World->OwningGameInstance = GameInstance;
	AActor* Guard = NewObject<AActor>(nullptr, TEXT("Guard_1"));
	Guard->StubWorld = World;

	const FString Shipped = UOamBridgeSubsystem::FindShippedBridge();
	CHECK(Shipped.Contains("/Binaries/ThirdParty/OamBridge/Linux/oam-bridge"),
		std::string("FindShippedBridge: the plugin's Binaries/ThirdParty/OamBridge/Linux/oam-bridge (") + *Shipped + ")");
	Bridge->BridgeArguments = TEXT("--engine scripted");
	FSubsystemCollectionBase Collection;
	Bridge->Initialize(Collection);
	CHECK(Bridge->IsBridgeRunning(), "the subsystem started the shipped bridge (no BridgeCommand, no OAM_BRIDGE_CMD)");

	UOamNpcComponent* Npc = NewObject<UOamNpcComponent>(Guard, TEXT("OamNpc"));
	UListener* L = NewObject<UListener>();
	L->Npc = Npc;
	CHECK(Npc->GetNpcId() == FString("Guard_1"), "an NPC without NpcId is named after its actor (two default components do not collide)");
	{
		// streamed sublevels: two "Guard_1" actors, one per map, get different, stable ids
		UObject* DocksMap = NewObject<UObject>(nullptr, TEXT("/Game/Maps/UEDPIE_0_Docks"));
		UObject* MainMap = NewObject<UObject>(nullptr, TEXT("/Game/Maps/Main"));
		ULevel* Docks = NewObject<ULevel>(DocksMap, TEXT("PersistentLevel"));
		ULevel* Main = NewObject<ULevel>(MainMap, TEXT("PersistentLevel"));
		World->PersistentLevel = Main;
		AActor* InDocks = NewObject<AActor>(Docks, TEXT("Guard_1"));
		AActor* InMain = NewObject<AActor>(Main, TEXT("Guard_1"));
		InDocks->StubWorld = World;
		InMain->StubWorld = World;
		UOamNpcComponent* A = NewObject<UOamNpcComponent>(InDocks, TEXT("OamNpc"));
		UOamNpcComponent* B = NewObject<UOamNpcComponent>(InMain, TEXT("OamNpc"));
		CHECK(A->GetNpcId() == FString("Docks/Guard_1"), std::string("a sublevel's actor: map/name without the PIE prefix (") + *A->GetNpcId() + ")");
		CHECK(B->GetNpcId() == FString("Guard_1"), "the persistent level's actor keeps its name");
		World->PersistentLevel = nullptr;
	}
	Npc->Config.Persona.Name = TEXT("Bram");
	Npc->Config.Persona.Role = TEXT("the gate guard");
	FOamTool Door;
	Door.Name = TEXT("open_door");
	Door.Description = TEXT("Opens a door");
	FOamToolParameter Which;
	Which.Name = TEXT("door");
	Which.Enum = {TEXT("north"), TEXT("south")};
	Door.Parameters.Add(Which);
	Npc->Config.Tools.Add(Door);
	Npc->Config.ExtraParamsJson = TEXT(R"({"script": [{"toolCalls": [{"name": "open_door", "arguments": {"door": "north"}}]},
		{"text": "The north door is open."}, {"text": "Hello from the node."},
		{"json": {"reasoning": "It is dark.", "choice": "question"}}]})");
	Npc->OnCreated.AddDynamic(L, &UListener::HandleCreated);
	Npc->OnTextDelta.AddDynamic(L, &UListener::HandleDelta);
	Npc->OnToolCall.AddDynamic(L, &UListener::HandleToolCall);
	Npc->OnTurnCompleted.AddDynamic(L, &UListener::HandleCompleted);
	Npc->OnTurnFailed.AddDynamic(L, &UListener::HandleFailed);
	Npc->UEStub_BeginPlay();
	CHECK(PumpUntil([&] { return L->Created == 1; }), "BeginPlay: npc/create from the USTRUCT config, OnCreated(true)");

	Npc->Respond(TEXT("Let me in"), FString());
	CHECK(PumpUntil([&] { return L->Completed == 1; }), "Respond: OnTurnCompleted");
	CHECK(L->ToolArgs == FString("{\"door\":\"north\"}"), std::string("OnToolCall with the arguments (") + *L->ToolArgs + "), answered with SubmitToolOutput");
	CHECK(L->Text == FString("The north door is open.") && L->Deltas > 0, std::string("the component's OnTextDelta and the answer: ") + *L->Text);

	UOamRespondAction* Node = UOamRespondAction::NpcRespond(Npc, TEXT("Hi"), FString());
	Node->OnTextDelta.AddDynamic(L, &UListener::HandleNodeDelta);
	Node->Completed.AddDynamic(L, &UListener::HandleNodeDone);
	Node->Failed.AddDynamic(L, &UListener::HandleNodeDone);
	Node->Activate();
	CHECK(PumpUntil([&] { return L->bNodeDone; }) && L->bNodeOk && L->NodeResult.Text == FString("Hello from the node.") && L->NodeDeltas > 0,
		std::string("async node NPC Respond: OnTextDelta pins, then Completed with the text (") + *L->NodeResult.Text + ")");
	CHECK(Node->bReadyToDestroy, "NPC Respond: SetReadyToDestroy after the outcome");

	L->bNodeDone = false;
	FOamDecisionOption LetIn, Question;
	LetIn.Name = TEXT("let_in");
	LetIn.Description = TEXT("open the gate");
	Question.Name = TEXT("question");
	Question.Description = TEXT("ask who they are");
	UOamDecideAction* Decide = UOamDecideAction::NpcDecide(Npc, TEXT("A stranger at the gate after dark."), {LetIn, Question});
	Decide->Decided.AddDynamic(L, &UListener::HandleDecided);
	Decide->Failed.AddDynamic(L, &UListener::HandleDecided);
	Decide->Activate();
	CHECK(PumpUntil([&] { return L->bNodeDone; }) && L->bNodeOk && L->Decision.Choice == FString("question") &&
			L->Decision.Reasoning == FString("It is dark."),
		std::string("async node NPC Decide: Decided with the choice (") + *L->Decision.Choice + ") and reasoning");

	// Prewarm, from the component and the subsystem: for the player, or for who speaks next and how that line starts.
	Bridge->OnTurnStarted.AddDynamic(L, &UListener::HandleStarted);
	const int Before = L->Completed;
	Npc->Prewarm();
	Npc->Prewarm(TEXT("Greta"), TEXT("Quiet"));
	CHECK(PumpUntil([&] { return L->Completed == Before + 2; }) && L->FinishReason == FString("prewarmed"),
		std::string("component Prewarm: OnTurnCompleted, FinishReason ") + *L->FinishReason);
	CHECK(Bridge->Prewarm(Npc->GetNpcId(), TEXT("Greta"), TEXT("Who")) && PumpUntil([&] { return L->Started.Num() == 3; }),
		"subsystem Prewarm with a speaker and a prefix: OnTurnStarted");
	FString Got;
	for (const FString& S : L->Started) Got += S + TEXT("; ");
	CHECK(L->Started.Num() == 3 && L->Started[0] == FString("prewarm||") && L->Started[1] == FString("prewarm|Greta|Quiet") &&
			L->Started[2] == FString("prewarm|Greta|Who"),
		std::string("Prewarm(): the player, no prefix; Prewarm(Speaker, PromptPrefix): both in OnTurnStarted (") + *Got + ")");

	// SaveTranscript: asynchronous, the save arrives through the delegate.
	FOamTranscriptSavedDelegate OnSaved;
	OnSaved.BindDynamic(L, &UListener::HandleSaved);
	auto T0 = std::chrono::steady_clock::now();
	Bridge->SaveTranscript(Npc->GetNpcId(), OnSaved);
	const double CallMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - T0).count();
	CHECK(!L->bSaveDone && CallMs < 50, "SaveTranscript returns at once (" + std::to_string(CallMs) + " ms), before the answer");
	CHECK(PumpUntil([&] { return L->bSaveDone; }) && L->bSaveOk && L->SaveJson.Contains("\"turns\""), "SaveTranscript: the save through the delegate");
	const FString Save = L->SaveJson;

	bool bRestored = false;
	FString RestoredId;
	Bridge->RestoreTranscriptThen(Save, TEXT("bram_copy"), [&](bool bOk, const FString& Id, const FOamError&) { bRestored = bOk; RestoredId = Id; });
	CHECK(PumpUntil([&] { return !RestoredId.IsEmpty(); }) && bRestored && RestoredId == FString("bram_copy"), "RestoreTranscript: success with the NPC's id");

	L->bSaveDone = false;
	Bridge->SaveTranscript(TEXT("nobody"), OnSaved);
	CHECK(PumpUntil([&] { return L->bSaveDone; }) && !L->bSaveOk && L->SaveError.Code == FString("unknown_npc") && L->SaveJson.IsEmpty(),
		std::string("SaveTranscript of an unknown NPC: bSuccess false, Error ") + *L->SaveError.Code + " (not an empty save)");
	bool bBadDone = false;
	FOamError BadError;
	Bridge->RestoreTranscriptThen(TEXT("not json"), FString(), [&](bool bOk, const FString&, const FOamError& E) { bBadDone = !bOk; BadError = E; });
	CHECK(bBadDone && BadError.Code == FString("invalid_params"), "RestoreTranscript of a bad save: failure reported");

	UOamSaveTranscriptAction* SaveNode = UOamSaveTranscriptAction::SaveNpcTranscript(Npc, Npc->GetNpcId());
	L->bNodeDone = false;
	struct UPins : UObject
	{
		bool bDone = false, bOk = false;
		void Saved(const FString& Json, const FOamError&) { bDone = true; bOk = Json.Contains("\"config\""); }
		void Failed(const FString&, const FOamError&) { bDone = true; }
	};
	UPins* Pins = NewObject<UPins>();
	SaveNode->Saved.AddDynamic(Pins, &UPins::Saved);
	SaveNode->Failed.AddDynamic(Pins, &UPins::Failed);
	SaveNode->Activate();
	CHECK(PumpUntil([&] { return Pins->bDone; }) && Pins->bOk, "async node Save NPC Transcript: Saved with the save");

	// A component destroyed during a turn: its callbacks are skipped, nothing crashes.
	Npc->Respond(TEXT("again"), FString());
	Npc->EndPlay(EEndPlayReason::Destroyed);
	delete Npc;
	for (int I = 0; I < 50; ++I)
	{
		UEStub_PumpGameThread();
		std::this_thread::sleep_for(std::chrono::milliseconds(5));
	}
	CHECK(true, "a component destroyed mid-turn: its callbacks are skipped");
	Bridge->Deinitialize();
	CHECK(!Bridge->IsBridgeRunning(), "Deinitialize closes the bridge");

	// A bridge that dies with a save request pending: failure with code "transport", at once.
	UOamBridgeSubsystem* Dying = NewObject<UOamBridgeSubsystem>();
	GameInstance->UEStub_Add(Dying);
	Dying->BridgeCommand = TEXT("sh -c 'read line; sleep 0.3; exit 3'");
	Dying->Initialize(Collection);
	L->bSaveDone = false;
	T0 = std::chrono::steady_clock::now();
	Dying->SaveTranscript(TEXT("bram"), OnSaved);
	CHECK(std::chrono::steady_clock::now() - T0 < std::chrono::milliseconds(50), "SaveTranscript on an unresponsive bridge does not block the game thread");
	CHECK(PumpUntil([&] { return L->bSaveDone; }, 10) && !L->bSaveOk && L->SaveError.Code == FString("transport"),
		std::string("SaveTranscript when the bridge dies: bSuccess false, Error ") + *L->SaveError.Code);
	Dying->Deinitialize();

	std::cout << (Failures == 0 ? "unreal layer: PASS" : "unreal layer: FAIL") << std::endl;
	return Failures == 0 ? 0 : 1;
}
